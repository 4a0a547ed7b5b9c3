"""Sweeps' bookkeeping: run states and the gate (`rules`), the status views over sqlite3 or the
store (`view`), and submitting, recording and cancelling a sweep's runs (`store`)."""
