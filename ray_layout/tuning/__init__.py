"""The tune loop, recipe-like: size, profile, fit, search, A/B, refit, report, each a phase over
data, with everything measured kept in the store so the same command resumes."""
