"""Small, dependency-free helpers shared by every layer (clocks, ids)."""
