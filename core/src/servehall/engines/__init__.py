"""Engines shipped with the core (imported only when their backend is selected)."""
