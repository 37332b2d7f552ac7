//! Errors of planning, fetching and applying inputs: one line each, with a
//! stable code and the item's id, like the manifest's parse errors:
//! `AGENT_INPUTS_DOWNLOAD_FAILED:skill:x: download failed: 404 Not Found`.

use std::fmt;

use crate::manifest::Shown;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// A hostPath outside every `--allow-host-path` root.
    HostPathNotAllowed,
    /// A hostPath that does not exist or cannot be read.
    HostPath,
    /// Two items both define the workspace, or a bind target is unusable.
    Conflict,
    /// A download URI that cannot be resolved or is not http(s).
    Uri,
    DownloadFailed,
    DownloadTooLarge,
    DownloadTimeout,
    ContentHashMismatch,
    /// The input cache could not be used.
    Cache,
    /// The archive tries something dangerous.
    ZipUnsafe,
    /// The archive is over a cap.
    ZipLimit,
    /// Not a readable zip.
    ZipInvalid,
    SkillMdMissing,
    GitFailed,
    GitTimeout,
    /// The copy source contains something that cannot be copied.
    CopyFailed,
    /// Writing the target failed.
    TargetFailed,
    BindFailed,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::HostPathNotAllowed => "AGENT_INPUTS_HOST_PATH_NOT_ALLOWED",
            Code::HostPath => "AGENT_INPUTS_HOST_PATH",
            Code::Conflict => "AGENT_INPUTS_CONFLICT",
            Code::Uri => "AGENT_INPUTS_URI",
            Code::DownloadFailed => "AGENT_INPUTS_DOWNLOAD_FAILED",
            Code::DownloadTooLarge => "AGENT_INPUTS_DOWNLOAD_TOO_LARGE",
            Code::DownloadTimeout => "AGENT_INPUTS_DOWNLOAD_TIMEOUT",
            Code::ContentHashMismatch => "AGENT_INPUTS_CONTENT_HASH_MISMATCH",
            Code::Cache => "AGENT_INPUTS_CACHE",
            Code::ZipUnsafe => "AGENT_INPUTS_ZIP_UNSAFE",
            Code::ZipLimit => "AGENT_INPUTS_ZIP_LIMIT",
            Code::ZipInvalid => "AGENT_INPUTS_ZIP_INVALID",
            Code::SkillMdMissing => "AGENT_INPUTS_SKILL_MD_MISSING",
            Code::GitFailed => "AGENT_INPUTS_GIT_FAILED",
            Code::GitTimeout => "AGENT_INPUTS_GIT_TIMEOUT",
            Code::CopyFailed => "AGENT_INPUTS_COPY_FAILED",
            Code::TargetFailed => "AGENT_INPUTS_TARGET_FAILED",
            Code::BindFailed => "AGENT_INPUTS_BIND_FAILED",
        }
    }
}

/// An input that could not be planned, fetched or applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct InputError {
    pub code: Code,
    /// The item's id.
    pub item: String,
    pub message: String,
}

impl InputError {
    pub fn new(code: Code, item: &str, message: impl Into<String>) -> Self {
        InputError { code, item: item.to_string(), message: message.into() }
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Ids and messages may quote the manifest: one line, as it is.
        write!(f, "{}:{}: {}", self.code.as_str(), Shown(&self.item), Shown(&self.message))
    }
}
