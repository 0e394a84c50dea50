"""A bash launch script read the way bash would run it, never run: the lexer (``lexer``), the
grammar (``parse``), expansions (``expand``, ``arithmetic``, ``escapes``), the evaluator
(``interpreter``) and where the launch command is (``launch``).  Every refusal is a
:class:`ray_layout.shell.refusal.ShellError`, which the model loader turns into
``ConfigError``."""
