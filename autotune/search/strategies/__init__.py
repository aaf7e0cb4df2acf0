"""Search strategies: what to measure next, given the candidates and what has been measured."""
