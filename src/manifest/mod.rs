//! The `agentInputs` manifest, version 1: types, parsing and validation.
//!
//! Pure: no I/O, no host lookups. [`parse`] turns the bytes of a manifest
//! (a bare object, or wrapped as `{"agentInputs": {...}}` so an `acp_open`
//! `init` object can be passed as is) into a [`Manifest`] whose every field
//! has been checked, or into the first [`ManifestError`], which carries a
//! stable code and the item's id.
//!
//! What is checked here: the version (only the integer 1), the envPatch
//! keys (HOME, USER, LOGNAME only), each item's id (non-empty, unique),
//! apply kind, access, target (a logical root and a relative path without
//! `..`, absolute parts or NUL), source, and that the source suits the apply
//! kind. What needs the host (does a host path exist and lie under an
//! allowed root, where is the download endpoint) is checked when the
//! inputs plan is made (`crate::inputs::Plan`).
//!
//! Names: the live backend speaks `httpZip`, `inlineText`, `downloadExtract`;
//! older documents of the protocol also say `http_zip`, `inline_text`,
//! `host_path`, `extract`, which are accepted as aliases. The types below
//! serialize with the backend's names.

mod error;
mod parse;
mod shown;

use serde::Serialize;

#[allow(unused_imports)]
pub use error::{Code, ManifestError};
#[allow(unused_imports)]
pub use parse::{MAX_ITEMS, parse, parse_value};
pub use shown::{Shown, shown};

/// A validated `agentInputs` manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always 1.
    pub version: u32,
    #[serde(skip_serializing_if = "EnvPatch::is_empty")]
    pub env_patch: EnvPatch,
    /// In application order.
    pub items: Vec<Item>,
}

/// The only environment a manifest may touch: the variables that make the
/// inputs discoverable (where `~` is, who the user is).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EnvPatch {
    #[serde(rename = "HOME", skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
    #[serde(rename = "USER", skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(rename = "LOGNAME", skip_serializing_if = "Option::is_none")]
    pub logname: Option<String>,
}

impl EnvPatch {
    pub fn is_empty(&self) -> bool {
        self.home.is_none() && self.user.is_none() && self.logname.is_none()
    }

    /// The patch as `(KEY, value)` pairs, in a fixed order.
    pub fn pairs(&self) -> Vec<(&'static str, &str)> {
        [("HOME", &self.home), ("USER", &self.user), ("LOGNAME", &self.logname)]
            .into_iter()
            .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
            .collect()
    }
}

/// One input: where it comes from, where it lands, how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Item {
    /// Unique within the manifest; named in every log line and error.
    pub id: String,
    /// Optional human-readable label (the backend's roles may send one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub apply: Apply,
    pub access: Access,
    pub source: Source,
    pub target: Target,
}

/// How an item lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Apply {
    /// Bind the host path at the target (`ro` enforced by the mount).
    BindMount,
    /// Copy the host path (recursively) to the target.
    Copy,
    /// Download a zip and extract it safely at the target.
    DownloadExtract,
    /// Write the inline text at the target.
    WriteFile,
    /// Check a git repository out at the target.
    Checkout,
}

impl Apply {
    pub fn as_str(self) -> &'static str {
        match self {
            Apply::BindMount => "bindMount",
            Apply::Copy => "copy",
            Apply::DownloadExtract => "downloadExtract",
            Apply::WriteFile => "writeFile",
            Apply::Checkout => "checkout",
        }
    }

    /// The source type this apply kind needs.
    pub fn source_type(self) -> &'static str {
        match self {
            Apply::BindMount | Apply::Copy => "hostPath",
            Apply::DownloadExtract => "httpZip",
            Apply::WriteFile => "inlineText",
            Apply::Checkout => "git",
        }
    }
}

/// Access intent. Enforced for `bindMount` (a read-only bind); the other
/// kinds write into roots the agent owns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    Ro,
    #[default]
    Rw,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Ro => "ro",
            Access::Rw => "rw",
        }
    }
}

/// Where an item's content comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Source {
    /// A path on the host running the sandbox (absolute, or relative to the
    /// manifest file's directory).
    HostPath { path: String },
    /// A zip from the inputs endpoint: a URI relative to the configured base
    /// URL, or absolute. `content_hash` is a lowercase hex sha256.
    HttpZip {
        uri: String,
        #[serde(rename = "contentHash", skip_serializing_if = "Option::is_none")]
        content_hash: Option<String>,
    },
    /// Literal UTF-8 text.
    InlineText { text: String },
    /// A git repository and an optional branch, tag or commit.
    Git {
        repo: String,
        #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
        git_ref: Option<String>,
    },
}

impl Source {
    pub fn type_name(&self) -> &'static str {
        match self {
            Source::HostPath { .. } => "hostPath",
            Source::HttpZip { .. } => "httpZip",
            Source::InlineText { .. } => "inlineText",
            Source::Git { .. } => "git",
        }
    }
}

/// A logical root and a normalized relative path under it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Target {
    pub root: Root,
    /// Normalized: no leading `/`, no `.` or `..` components, no empty
    /// components; `""` is the root itself.
    pub path: String,
}

impl Target {
    /// `true` when the target is the root directory itself (`"."` or `""`).
    pub fn is_root(&self) -> bool {
        self.path.is_empty()
    }

    /// `ROOT/path` (or `ROOT/.`), for messages.
    pub fn display(&self) -> String {
        format!("{}/{}", self.root.as_str(), if self.path.is_empty() { "." } else { &self.path })
    }
}

/// The logical roots an item can land under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Root {
    /// `/workspace`: the code and what the agent produces.
    Workspace,
    /// The sandbox user's home (`~`).
    UserHome,
    /// `/scratch`: a private tmpfs, gone when the sandbox ends.
    Scratch,
}

impl Root {
    pub fn as_str(self) -> &'static str {
        match self {
            Root::Workspace => "WORKSPACE",
            Root::UserHome => "USER_HOME",
            Root::Scratch => "SCRATCH",
        }
    }
}

/// Guest path of the `SCRATCH` root.
pub const SCRATCH_DIR: &str = "/scratch";
