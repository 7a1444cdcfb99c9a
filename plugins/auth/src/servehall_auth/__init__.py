"""servehall-auth: API keys, JWT, scopes and token-aware rate limits for servehall."""
