//! Manifest errors: values with a stable code, the item they concern, and
//! one line of explanation.
//!
//! They render as `CODE:<item>: message` (or `CODE: message` for the
//! manifest as a whole), the shape the tuixiu backend already shows for
//! the Node proxy's errors, e.g.
//! `INVALID_AGENT_INPUTS_ITEM_TARGET:skills: target.path must not escape root`.

use std::fmt;

use super::Shown;

/// The stable error codes of manifest parsing. The string forms are part of
/// the interface (the backend and users match on them); never rename one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Not JSON, not an object, or a key that v1 does not have.
    Invalid,
    /// `version` missing or not the integer 1.
    UnsupportedVersion,
    /// `items` missing, not an array, or too long.
    InvalidItems,
    /// `envPatch` not an object, or a value that is not a usable string.
    InvalidEnvPatch,
    /// An `envPatch` key other than HOME, USER, LOGNAME.
    InvalidEnvPatchKey,
    /// An item that is not an object, or has a key v1 does not have.
    InvalidItem,
    InvalidItemId,
    InvalidItemApply,
    InvalidItemAccess,
    InvalidItemTarget,
    InvalidItemTargetRoot,
    InvalidItemSource,
    InvalidItemSourceType,
    InvalidItemSourceHostPath,
    InvalidItemSourceUri,
    InvalidItemSourceContentHash,
    InvalidItemSourceText,
    InvalidItemSourceRepo,
    InvalidItemSourceRef,
    /// A valid source with an apply kind that cannot use it.
    InvalidItemApplySource,
}

impl Code {
    /// Every code (the metrics count failures by code, and only these).
    pub const ALL: [Code; 20] = [
        Code::Invalid,
        Code::UnsupportedVersion,
        Code::InvalidItems,
        Code::InvalidEnvPatch,
        Code::InvalidEnvPatchKey,
        Code::InvalidItem,
        Code::InvalidItemId,
        Code::InvalidItemApply,
        Code::InvalidItemAccess,
        Code::InvalidItemTarget,
        Code::InvalidItemTargetRoot,
        Code::InvalidItemSource,
        Code::InvalidItemSourceType,
        Code::InvalidItemSourceHostPath,
        Code::InvalidItemSourceUri,
        Code::InvalidItemSourceContentHash,
        Code::InvalidItemSourceText,
        Code::InvalidItemSourceRepo,
        Code::InvalidItemSourceRef,
        Code::InvalidItemApplySource,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Code::Invalid => "INVALID_AGENT_INPUTS",
            Code::UnsupportedVersion => "UNSUPPORTED_AGENT_INPUTS_VERSION",
            Code::InvalidItems => "INVALID_AGENT_INPUTS_ITEMS",
            Code::InvalidEnvPatch => "INVALID_AGENT_INPUTS_ENV_PATCH",
            Code::InvalidEnvPatchKey => "INVALID_AGENT_INPUTS_ENV_PATCH_KEY",
            Code::InvalidItem => "INVALID_AGENT_INPUTS_ITEM",
            Code::InvalidItemId => "INVALID_AGENT_INPUTS_ITEM_ID",
            Code::InvalidItemApply => "INVALID_AGENT_INPUTS_ITEM_APPLY",
            Code::InvalidItemAccess => "INVALID_AGENT_INPUTS_ITEM_ACCESS",
            Code::InvalidItemTarget => "INVALID_AGENT_INPUTS_ITEM_TARGET",
            Code::InvalidItemTargetRoot => "INVALID_AGENT_INPUTS_ITEM_TARGET_ROOT",
            Code::InvalidItemSource => "INVALID_AGENT_INPUTS_ITEM_SOURCE",
            Code::InvalidItemSourceType => "INVALID_AGENT_INPUTS_ITEM_SOURCE_TYPE",
            Code::InvalidItemSourceHostPath => "INVALID_AGENT_INPUTS_ITEM_SOURCE_HOST_PATH",
            Code::InvalidItemSourceUri => "INVALID_AGENT_INPUTS_ITEM_SOURCE_URI",
            Code::InvalidItemSourceContentHash => "INVALID_AGENT_INPUTS_ITEM_SOURCE_CONTENT_HASH",
            Code::InvalidItemSourceText => "INVALID_AGENT_INPUTS_ITEM_SOURCE_TEXT",
            Code::InvalidItemSourceRepo => "INVALID_AGENT_INPUTS_ITEM_SOURCE_REPO",
            Code::InvalidItemSourceRef => "INVALID_AGENT_INPUTS_ITEM_SOURCE_REF",
            Code::InvalidItemApplySource => "INVALID_AGENT_INPUTS_ITEM_APPLY_SOURCE",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One reason a manifest was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ManifestError {
    pub code: Code,
    /// The item's id, or its 1-based position while the id is not known
    /// yet, or the offending envPatch key; `None` for the whole manifest.
    pub subject: Option<String>,
    pub message: String,
}

impl ManifestError {
    pub(crate) fn new(code: Code, subject: Option<&str>, message: impl Into<String>) -> Self {
        ManifestError { code, subject: subject.map(str::to_string), message: message.into() }
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Subjects and messages may quote the manifest: one line, as it is.
        match &self.subject {
            Some(subject) => write!(f, "{}:{}: {}", self.code, Shown(subject), Shown(&self.message)),
            None => write!(f, "{}: {}", self.code, Shown(&self.message)),
        }
    }
}
