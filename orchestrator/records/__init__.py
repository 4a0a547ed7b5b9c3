"""What happened and what it cost: the SQLite/PostgreSQL store, history, sweeps."""
