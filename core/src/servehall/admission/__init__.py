"""Admission: who the caller is (principal), what they may use (access), how much
(usage), what passes (filters) and when a request runs (the scheduler contract)."""
