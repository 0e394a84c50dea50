"""The live A/B test: pure statistics (batch means, Welch and equivalence tests at looks, early
stops, ties settled by the tie-break, each arm's first look from the search's predictions,
replay, GPU-second accounting) and the shell that runs the arms on the cluster and stops them as
the statistics decide."""
