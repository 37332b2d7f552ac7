//! `check`: can `run` work on this host, and what is missing?
pub fn main(_args: crate::cli::CheckArgs) -> u8 {
    0
}
