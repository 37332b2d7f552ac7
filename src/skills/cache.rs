//! The result cache: a repeated job is answered with the run that
//! succeeded for the same inputs, and no engine starts (docs/skills.md,
//! "The result cache").
//!
//! The key is upstream's: the SHA-256 of the stable JSON (keys sorted,
//! no spaces, non-ASCII escaped, as Python's `json.dumps(sort_keys=True,
//! separators=(",", ":"))`) of `{skill_id, engine, skill_fingerprint,
//! parameter, engine_options, input_manifest_hash, inline_input_hash}`,
//! where the fingerprint hashes the package's `SKILL.md`, `runner.json`,
//! schemas and the engine's settings asset, the manifest lists every
//! uploaded file with its hash and size, and the inline hash is that of
//! `input` (empty when there is none). `runtime_options` are not in it.
//!
//! Entries are one JSON file each in `<data>/jobs/cache/`, written by the
//! one atomic writer ([`crate::hostfs::atomic`]), synced, once the run's
//! terminal record is on disk (lookups see an entry from the moment its
//! run's success is visible: a client that repeats a job as soon as it
//! saw it succeed gets a hit). An entry names its run and what its
//! artifacts were (path and size); a lookup answers only when the run's
//! `result.json` and every one of those artifacts are still there as
//! regular files of the same size, and drops the entry otherwise. At most
//! `max` entries are kept: inserting one more evicts the least recently
//! used (a hit or the insert counts as a use; use times live in memory,
//! so after a restart the order starts from the entries' creation).

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::OFlag;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::artifacts;
use super::package::Skill;
use crate::hostfs::atomic::{self, Durability};
use crate::hostfs::beneath::{self as fsio, Links};

/// Largest package file hashed into the fingerprint (the package loader
/// reads none larger).
const MAX_PACKAGE_FILE: u64 = 16 << 20;

/// The SHA-256 of `bytes`, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Python's `json.dumps(v, sort_keys=True, separators=(",", ":"))`.
pub fn stable_json(v: &Value) -> String {
    let mut out = String::new();
    write_stable(v, &mut out);
    out
}

fn write_stable(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_str(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_stable(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(k, out);
                out.push(':');
                write_stable(&map[k], out);
            }
            out.push('}');
        }
    }
}

/// A JSON string with Python's `ensure_ascii` escapes.
fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
}

/// The package files that decide what a job of `engine` does, hashed:
/// `SKILL.md`, `assets/runner.json`, the three schemas and the engine's
/// settings asset, each as `name:sha256`, sorted by path.
pub fn skill_fingerprint(skill: &Skill, engine: &str) -> std::io::Result<String> {
    let root = fsio::open_dir(&skill.dir)?;
    let settings = match engine {
        "gemini" => "assets/gemini_settings.json",
        "iflow" => "assets/iflow_settings.json",
        _ => "assets/codex_config.toml",
    };
    let mut rels: Vec<&str> = vec!["SKILL.md", "assets/runner.json", settings];
    rels.extend([&skill.input.rel, &skill.parameter.rel, &skill.output.rel].map(String::as_str));
    let mut paths: Vec<Vec<&str>> =
        rels.iter().map(|r| r.split('/').filter(|c| !c.is_empty() && *c != ".").collect()).collect();
    paths.sort();
    paths.dedup();
    let mut lines = Vec::new();
    for parts in paths {
        let rel = parts.join("/");
        match fsio::read_beneath(root.as_fd(), &rel, Links::Follow, MAX_PACKAGE_FILE) {
            Ok(bytes) => lines.push(format!("{}:{}", parts.last().unwrap_or(&""), sha256_hex(&bytes))),
            Err(fsio::ReadError::Open(nix::errno::Errno::ENOENT)) => {}
            Err(e) => return Err(std::io::Error::other(format!("{rel} in the skill package: {e}"))),
        }
    }
    Ok(sha256_hex(lines.join("\n").as_bytes()))
}

/// `{"files": [{path, sha256, size}]}` of every regular file under
/// `uploads`, sorted by path (component by component, as Python sorts
/// paths).
pub fn input_manifest(uploads: &Path) -> std::io::Result<Value> {
    let dir = fsio::open_dir(uploads)?;
    let walked = artifacts::walk(dir.as_fd(), &[]).map_err(std::io::Error::from)?;
    let mut files = walked.files;
    files.sort_by(|a, b| a.rel.split('/').cmp(b.rel.split('/')));
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let (file, st) = fsio::open_regular(dir.as_fd(), &f.rel, Links::Never)
            .map_err(|e| std::io::Error::other(format!("uploads/{}: {e}", f.rel)))?;
        let mut hasher = Sha256::new();
        let mut reader = std::io::BufReader::with_capacity(256 * 1024, file);
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        out.push(json!({"path": f.rel, "sha256": hex::encode(hasher.finalize()), "size": st.st_size}));
    }
    Ok(json!({"files": out}))
}

/// The manifest of no uploads.
pub fn empty_manifest() -> Value {
    json!({"files": []})
}

/// Upstream's `engine_options`: the model, when the request names one.
pub fn engine_options(model: Option<&str>) -> Value {
    match model {
        Some(m) => json!({"model": m}),
        None => json!({}),
    }
}

/// The inputs of one job that decide its result.
pub struct KeyParts<'a> {
    pub skill_id: &'a str,
    pub engine: &'a str,
    pub fingerprint: &'a str,
    pub parameter: &'a Map<String, Value>,
    pub model: Option<&'a str>,
    pub manifest: &'a Value,
    pub input: &'a Map<String, Value>,
}

impl KeyParts<'_> {
    /// The cache key.
    pub fn key(&self) -> String {
        let inline = if self.input.is_empty() {
            String::new()
        } else {
            sha256_hex(stable_json(&Value::Object(self.input.clone())).as_bytes())
        };
        sha256_hex(
            stable_json(&json!({
                "skill_id": self.skill_id,
                "engine": self.engine,
                "skill_fingerprint": self.fingerprint,
                "parameter": self.parameter,
                "engine_options": engine_options(self.model),
                "input_manifest_hash": sha256_hex(stable_json(self.manifest).as_bytes()),
                "inline_input_hash": inline,
            }))
            .as_bytes(),
        )
    }
}

/// An artifact as it was when the run was cached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    pub path: String,
    pub size: u64,
}

/// One cached run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub key: String,
    pub run_id: String,
    /// The request whose run it is.
    pub request_id: String,
    pub created_at: String,
    pub warnings: Vec<String>,
    /// Every regular file under `artifacts/`, run-relative.
    pub artifacts: Vec<Kept>,
}

/// The cache of one data directory.
pub struct Cache {
    dir: PathBuf,
    data_dir: PathBuf,
    max: usize,
    index: Mutex<Index>,
    /// Lookups since the start that found a whole run, and that did not.
    hits: AtomicU64,
    misses: AtomicU64,
}

#[derive(Default)]
struct Index {
    entries: HashMap<String, (Entry, u64)>,
    clock: u64,
}

impl Index {
    fn touch(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
}

impl Cache {
    /// Loads the entries under `jobs_dir/cache` (`data_dir` holds the
    /// runs). An unreadable entry is removed: a cache entry can always be
    /// made again.
    pub fn open(jobs_dir: &Path, data_dir: &Path, max: usize) -> std::io::Result<Cache> {
        let dir = jobs_dir.join("cache");
        std::fs::create_dir_all(&dir)?;
        let mut loaded: Vec<Entry> = Vec::new();
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let path = e.path();
            let parsed = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Entry>(&b).ok())
                .filter(|entry| e.file_name().to_str() == Some(&format!("{}.json", entry.key)));
            match parsed {
                Some(entry) => loaded.push(entry),
                None => {
                    tracing::warn!("cache entry {}: unreadable; removed", path.display());
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        loaded.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        let mut index = Index::default();
        for entry in loaded {
            let tick = index.touch();
            index.entries.insert(entry.key.clone(), (entry, tick));
        }
        let cache = Cache {
            dir,
            data_dir: data_dir.to_path_buf(),
            max: max.max(1),
            index: Mutex::new(index),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        };
        cache.evict_over(0);
        Ok(cache)
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    /// The entry for `key` whose run is still whole, if any; a stale one
    /// is dropped.
    pub fn lookup(&self, key: &str) -> Option<Entry> {
        let found = self.find(key);
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Lookups since the start: (hits, misses).
    pub fn lookups(&self) -> (u64, u64) {
        (self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed))
    }

    fn find(&self, key: &str) -> Option<Entry> {
        let entry = {
            let mut index = self.index.lock().unwrap();
            let tick = index.touch();
            let slot = index.entries.get_mut(key)?;
            slot.1 = tick;
            slot.0.clone()
        };
        if self.is_whole(&entry) {
            return Some(entry);
        }
        tracing::info!("cache entry {key}: run {} lost files; dropped", entry.run_id);
        self.remove(key);
        None
    }

    /// Whether the run of `entry` still has its result and every artifact
    /// it had, as regular files of the same size (nothing followed).
    fn is_whole(&self, entry: &Entry) -> bool {
        if !fsio::is_plain_name(&entry.run_id) {
            return false;
        }
        let run = self.data_dir.join("runs").join(&entry.run_id);
        let Ok(run_fd) = fsio::open_dir(&run) else { return false };
        if !fsio::is_regular_beneath(run_fd.as_fd(), "result/result.json", Links::Never) {
            return false;
        }
        let Ok(ws) = fsio::open_dir(&run.join("workspace")) else { return false };
        entry.artifacts.iter().all(|a| {
            fsio::open_beneath(ws.as_fd(), &a.path, OFlag::O_PATH | OFlag::O_NOFOLLOW, Links::Never)
                .and_then(|fd| nix::sys::stat::fstat(fd.as_fd()))
                .is_ok_and(|st| {
                    fsio::file_type(&st) == nix::sys::stat::SFlag::S_IFREG && st.st_size as u64 == a.size
                })
        })
    }

    /// The entry that would record `run_id` (its artifacts as they are
    /// now) under `key`.
    pub fn entry_for(&self, key: &str, run_id: &str, request_id: &str, warnings: &[String]) -> Entry {
        let workspace = self.data_dir.join("runs").join(run_id).join("workspace");
        let listed = artifacts::open_artifacts_dir(&workspace)
            .and_then(|d| artifacts::walk(d.as_fd(), &[]))
            .map(|w| w.files)
            .unwrap_or_default();
        Entry {
            key: key.to_string(),
            run_id: run_id.to_string(),
            request_id: request_id.to_string(),
            created_at: super::store::now(),
            warnings: warnings.to_vec(),
            artifacts: listed
                .into_iter()
                .map(|f| Kept { path: format!("artifacts/{}", f.rel), size: f.size })
                .collect(),
        }
    }

    /// Answers lookups with `entry` from now on (in memory only: its run's
    /// success becomes visible at this moment, before its record is on
    /// disk, so a repeat seen right after it hits); [`Cache::persist`]
    /// writes it once the record is.
    pub fn remember(&self, entry: Entry) {
        let mut index = self.index.lock().unwrap();
        let tick = index.touch();
        index.entries.insert(entry.key.clone(), (entry, tick));
    }

    /// Writes `entry` (synced), then evicts the least recently used
    /// beyond the cap.
    pub fn persist(&self, entry: &Entry) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(entry).expect("plain data");
        atomic::write(&self.path(&entry.key), &bytes, Durability::Synced)?;
        self.evict_over(0);
        Ok(())
    }

    /// Records `run_id` under `key`: [`Cache::entry_for`],
    /// [`Cache::remember`], [`Cache::persist`].
    pub fn insert(
        &self,
        key: &str,
        run_id: &str,
        request_id: &str,
        warnings: &[String],
    ) -> std::io::Result<()> {
        let entry = self.entry_for(key, run_id, request_id, warnings);
        self.remember(entry.clone());
        self.persist(&entry)
    }

    /// Drops the entry for `key` if it is the one of `run_id` (a success
    /// remembered that did not stand).
    pub fn forget(&self, key: &str, run_id: &str) {
        let ours = self.index.lock().unwrap().entries.get(key).is_some_and(|(e, _)| e.run_id == run_id);
        if ours {
            self.remove(key);
        }
    }

    /// Evicts least recently used entries until at most `max - room` are left.
    fn evict_over(&self, room: usize) {
        let victims: Vec<String> = {
            let index = self.index.lock().unwrap();
            let over = (index.entries.len() + room).saturating_sub(self.max);
            let mut by_use: Vec<(&u64, &String)> = index.entries.iter().map(|(k, (_, t))| (t, k)).collect();
            by_use.sort();
            by_use.into_iter().take(over).map(|(_, k)| k.clone()).collect()
        };
        for key in victims {
            tracing::debug!("cache entry {key}: evicted (least recently used of {})", self.max);
            self.remove(&key);
        }
    }

    fn remove(&self, key: &str) {
        self.index.lock().unwrap().entries.remove(key);
        if let Err(e) = std::fs::remove_file(self.path(key))
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("cache entry {key}: cannot remove: {e}");
        }
    }

    /// Drops every entry; returns how many there were.
    pub fn clear(&self) -> usize {
        let keys: Vec<String> = self.index.lock().unwrap().entries.keys().cloned().collect();
        for key in &keys {
            self.remove(key);
        }
        keys.len()
    }

    /// Entries now.
    pub fn len(&self) -> usize {
        self.index.lock().unwrap().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_json_is_pythons() {
        let v = json!({"b": [1, 2.5, true, null], "a": {"z": "é\n\"", "y": "😀"}});
        assert_eq!(stable_json(&v), r#"{"a":{"y":"\ud83d\ude00","z":"\u00e9\n\""},"b":[1,2.5,true,null]}"#);
    }

    /// A key computed with Python by upstream's algorithm (its
    /// `compute_cache_key` with `json.dumps` and `hashlib`), and that
    /// every part changes it.
    #[test]
    fn keys_are_upstreams_and_change_with_every_part() {
        let manifest = json!({"files": [{"path": "input_file", "sha256": "ab", "size": 3}]});
        let (parameter, input) = (json!({"b": true, "a": null}), json!({"query": "é 😀", "n": [1, 2.5]}));
        let (parameter, input) = (parameter.as_object().unwrap(), input.as_object().unwrap());
        let base = KeyParts {
            skill_id: "demo",
            engine: "gemini",
            fingerprint: "fp",
            parameter,
            model: Some("m"),
            manifest: &manifest,
            input,
        };
        let k = base.key();
        assert_eq!(k, "a50caaf9a4b546659a9df8587efeb6436f16595a7ffa199426f0ccd9cea5cf0d");
        let (empty, m0) = (Map::new(), empty_manifest());
        for other in [
            KeyParts { skill_id: "t", ..base },
            KeyParts { engine: "codex", ..base },
            KeyParts { fingerprint: "g", ..base },
            KeyParts { parameter: &empty, ..base },
            KeyParts { model: None, ..base },
            KeyParts { manifest: &m0, ..base },
            KeyParts { input: &empty, ..base },
        ] {
            assert_ne!(other.key(), k);
        }
    }

    #[test]
    fn entries_check_their_run_and_evict_the_least_recently_used() {
        let data = tempfile::tempdir().unwrap();
        let jobs = data.path().join("jobs");
        let run = |id: &str, artifact: &[u8]| {
            let ws = data.path().join("runs").join(id).join("workspace/artifacts");
            std::fs::create_dir_all(&ws).unwrap();
            std::fs::write(ws.join("a.md"), artifact).unwrap();
            let result = data.path().join("runs").join(id).join("result");
            std::fs::create_dir_all(&result).unwrap();
            std::fs::write(result.join("result.json"), "{}").unwrap();
        };
        run("r1", b"one");
        run("r2", b"two");
        run("r3", b"three");
        let cache = Cache::open(&jobs, data.path(), 2).unwrap();
        cache.insert("k1", "r1", "q1", &[]).unwrap();
        cache.insert("k2", "r2", "q2", &["W".into()]).unwrap();
        assert_eq!(cache.lookup("k1").unwrap().run_id, "r1");
        // k2 is now the least recently used.
        cache.insert("k3", "r3", "q3", &[]).unwrap();
        assert_eq!(cache.len(), 2);
        assert!(cache.lookup("k2").is_none());
        assert!(!jobs.join("cache/k2.json").exists());

        // Reloaded from disk.
        drop(cache);
        let cache = Cache::open(&jobs, data.path(), 2).unwrap();
        assert_eq!(cache.lookup("k3").unwrap().artifacts, [Kept { path: "artifacts/a.md".into(), size: 5 }]);

        // An artifact changed or removed: never answered again.
        std::fs::write(data.path().join("runs/r3/workspace/artifacts/a.md"), "3").unwrap();
        assert!(cache.lookup("k3").is_none());
        assert!(!jobs.join("cache/k3.json").exists());
        std::fs::remove_file(data.path().join("runs/r1/workspace/artifacts/a.md")).unwrap();
        assert!(cache.lookup("k1").is_none());
        assert!(cache.is_empty());

        cache.insert("k2", "r2", "q2", &[]).unwrap();
        std::fs::write(jobs.join("cache/junk.json"), "{").unwrap();
        assert_eq!(cache.clear(), 1);
        let cache = Cache::open(&jobs, data.path(), 2).unwrap();
        assert!(cache.is_empty() && !jobs.join("cache/junk.json").exists());
    }
}
