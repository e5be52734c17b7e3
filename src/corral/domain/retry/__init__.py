"""Session retry (spec document 5), pure: the policy, failure classification, backoff, state.

No I/O here: the store persists what these decide, and the retry handler
(`handlers.sessions.retries`) applies the decisions in batches. Modules: `policy`
(RetryPolicy, its layers), `classify` (every failure cause's class), `backoff` (the delay),
`decide` (one ended session's decision), `state` (the chain in words).
"""
