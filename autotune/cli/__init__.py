"""The ``autotune`` command: ``main`` parses the verb and hands off to one module per verb, each
parsing its arguments and calling the layer below. May import any layer."""
