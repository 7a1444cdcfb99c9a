"""Stored responses of ``/v1/responses`` (:mod:`servehall.responses.store`)."""
