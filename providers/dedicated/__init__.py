"""Monthly servers the user registered (`orch servers add`), rented through the store."""
