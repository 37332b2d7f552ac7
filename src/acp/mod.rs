//! The ACP client side of the daemon: what it does for the agent of a run.
//!
//! | module | job |
//! |---|---|
//! | [`transport`] | NDJSON JSON-RPC over the agent's stdio: raw `Value`s, id mapping, concurrent agent requests, `$/cancel_request` |
//! | [`host`] | one agent process: start, `initialize`, sessions, prompts, controls, cancel, shutdown |
//! | [`client`] | the methods the agent calls: `fs/*`, `terminal/*`, `session/request_permission`; anything else `-32601` |
//! | [`fs`] | paths resolved inside the sandbox's own tree, confined to the workspace and home |
//! | [`terminal`] | terminal processes, exit status |
//! | [`output`] | a terminal's output: the tail ACP returns, in a ring, in memory within the run's budget or in an anonymous file |
//! | [`port`] | what the host needs from the daemon, and owns: [`port::Settings`], the [`port::Sink`] for its reports |
//!
//! See docs/acp.md.

pub mod client;
pub mod fs;
pub mod host;
pub mod output;
pub mod port;
pub mod terminal;
pub mod transport;
