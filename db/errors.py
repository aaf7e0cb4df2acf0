"""The one exception ``db`` raises, and the helper that keeps passwords out of its messages.

``db`` imports nothing from ``autotune``; the CLI translates :class:`StorageError` into its own
error type at the boundary. Messages are one line, name the fix, and show URLs only through
:func:`hide_password`.
"""

from __future__ import annotations

import re

# user:password@host in anything that looks like a URL, parseable or not ('postgres//u:pw@h').
_PASSWORD_IN_URL = re.compile(r"([^:/@\s]+:)[^@/\s]*@")
# ?password=... / &password=... (PostgreSQL and MySQL drivers accept the password there too).
_PASSWORD_IN_QUERY = re.compile(r"([?&](?:password|passwd|pwd)=)[^&#\s]*",
                                re.IGNORECASE)


class StorageError(Exception):
    """A database could not be opened, read or written; the message says what to do.

    ``exit_code`` is the CLI's runtime-failure code (1), so the CLI can translate it without
    knowing about storage.
    """

    exit_code = 1


def hide_password(url: str, secret: str | None = None) -> str:
    """``url`` (or any text holding one) with the password replaced by ``***``.

    Works on strings that SQLAlchemy cannot parse, since those are the ones that end up in error
    messages. ``secret``, when given, is also masked wherever it appears (a driver may quote it).
    """
    text = _PASSWORD_IN_QUERY.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1***@", url))
    if secret:
        text = text.replace(secret, "***")
    return text
