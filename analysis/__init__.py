"""Figures from results files (never re-trains)."""
