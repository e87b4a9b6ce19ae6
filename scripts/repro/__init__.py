"""The comparisons of scripts/reproduce.py, one module per paper, and their shared half (common)."""
