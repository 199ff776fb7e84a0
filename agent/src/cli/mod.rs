//! The `ipq` command line: talks to the agent's API (owner: the CLI work of issue #4).
