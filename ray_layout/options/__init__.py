"""Settings that carry their own command-line flag: the flag's metadata on a dataclass field
(``flag_fields.py``) and the checks its value must pass (``checks.py``). Below every layer but
the errors, so that the A/B test's, the run policy's and the tune's own settings declare their
flags where they are defined, once."""
