//! What an engine printed (the agent's own text, so untrusted): each
//! built-in engine's `Engine::answer` (codex NDJSON events, gemini's JSON
//! envelope, iflow's plain text; the first byte picks one), then
//! `engines::extract_json` with upstream's repairs.
//!
//! Checked: no panic, no super-linear blow-up (libFuzzer's -timeout); an
//! extracted answer is a JSON object, unrepaired only when the text is
//! exactly one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tuixiu_sandbox::skills::engines::{Engines, extract_json};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let stdout = String::from_utf8_lossy(rest);
    let engines = Engines::builtin();
    let names = engines.names();
    let engine = engines.get(&names[usize::from(pick) % names.len()]).unwrap();
    let Ok((text, _)) = engine.answer(&stdout) else { return };
    if let Some((value, repaired)) = extract_json(&text) {
        assert!(value.is_object(), "{value}");
        let exact = serde_json::from_str::<Value>(&text).ok().filter(Value::is_object);
        assert_eq!(!repaired, exact.is_some(), "repaired = {repaired} for {text:?}");
    }
});
