"""Rules: pure functions from machine facts (+ the user's overrides) to one run plan and findings."""
