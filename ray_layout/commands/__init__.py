"""The command line: a module per command (``measure.py`` for the three measurement commands,
which share their flags), each with typed settings validated before any work starts; bad input
ends in one line on stderr and exit status 2."""
