"""The marker plugins use for their hook implementations."""

import pluggy

hookimpl = pluggy.HookimplMarker("servehall")
