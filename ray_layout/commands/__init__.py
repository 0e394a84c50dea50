"""The command line: one module per command, each with typed settings validated before any
work starts; bad input ends in one line on stderr and exit status 2."""
