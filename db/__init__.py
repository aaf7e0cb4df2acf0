"""Persistence of studies, trials, memory and spans (SQLAlchemy 2.0); imports nothing else."""
