"""The one exception ``db`` raises, the translation of database errors into it, and the helper
that keeps passwords out of its messages.

``db`` imports nothing from ``autotune``; the CLI translates :class:`StorageError` into its own
error type at the boundary. Messages are one line, name the fix, and show URLs only through
:func:`hide_password`. A driver's error becomes one through :func:`translate`, which adds the fix
that ``HINTS`` gives for the driver's words.
"""

from __future__ import annotations

import re

# user:password@host in anything that looks like a URL, parseable or not ('postgres//u:pw@h').
_PASSWORD_IN_URL = re.compile(r"([^:/@\s]+:)[^@/\s]*@")
# ?password=... / &password=... (PostgreSQL and MySQL drivers accept the password there too).
_PASSWORD_IN_QUERY = re.compile(r"([?&](?:password|passwd|pwd)=)[^&#\s]*", re.IGNORECASE)


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


_MISSING_PARENT = "it refers to a study or trial that does not exist"
_DUPLICATE_KEY = (
    "a row with that key is already stored (study name, trial number in its study, "
    "or a rank's memory category or step)"
)
_SERVER_DOWN = "check the host and port, and that the database server is running"
HINTS = (
    ("file is not a database", "point the URL at an autotune database or at a new file"),
    (
        "database disk image is malformed",
        (
            "the file is damaged: restore it from a backup or "
            "use a new database (sqlite3's .recover may save "
            "some rows)"
        ),
    ),
    (
        "unable to open database file",
        ("check that the path is right and its directory exists and is writable"),
    ),
    ("readonly database", "the database is read-only: use a writable file (and no mode=ro)"),
    (
        "database is locked",
        (
            "another process is writing to it (the search driver must be the "
            "only writer): wait for it to finish or use another database"
        ),
    ),
    ("disk is full", "free some disk space"),
    ("disk i/o error", "check the disk and file system holding the database"),
    ("connection refused", _SERVER_DOWN),
    ("could not connect", _SERVER_DOWN),
    ("could not translate host", "check the host name in the URL"),
    ("timeout expired", _SERVER_DOWN),
    ("can't connect", _SERVER_DOWN),
    ("authentication failed", "check the user name and password"),
    ("access denied", "check the user name and password"),
    ("does not exist", "create the database on the server first"),
    ("no such table", "the autotune tables are missing or damaged: use a new database"),
    ("no such column", "the autotune tables are damaged: use a new database"),
    # SQLite's words, then PostgreSQL's.
    ("foreign key constraint failed", _MISSING_PARENT),
    ("violates foreign key constraint", _MISSING_PARENT),
    ("unique constraint failed", _DUPLICATE_KEY),
    ("violates unique constraint", _DUPLICATE_KEY),
)
"""Driver messages (lower-cased substrings) and what the user should do about them."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def translate(exc: BaseException, action: str, display: str, password: str | None) -> StorageError:
    """A one-line StorageError for a database error: what failed, the driver's words, the fix."""
    original = getattr(exc, "orig", None) or exc
    detail = first_line(original)
    lowered = detail.lower()
    hint = next((fix for pattern, fix in HINTS if pattern in lowered), None)
    message = f"{action} failed on {display}: {detail}"
    if hint:
        message += f"; {hint}"
    return StorageError(hide_password(message, password))
