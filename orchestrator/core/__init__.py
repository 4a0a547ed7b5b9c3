"""The pure core: the job file, sizing, memory savers, scheduling, pricing and money.

No I/O beyond reading the user's and orch's own data files; no SSH, no database."""
