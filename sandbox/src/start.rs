//! The public entry points: a spec becomes a prepared plan, which the
//! launcher ([`crate::launch`]) starts and monitors, serving the sandbox's
//! nested-sandbox portal ([`crate::nested`]) when it has one.

use crate::apply::ApplyContext;
use crate::error::LaunchError;
use crate::launch::{self, ApplyError, ApplyFn, ExitStatus, LaunchOptions, Watch};
use crate::nested;
use crate::prepare::Plan;
use crate::spec::SandboxSpec;

/// Runs `spec` to completion. Must be called from a single-threaded process
/// (the `run` CLI, or a helper process spawned by a multi-threaded caller).
/// Deferred binds, if any, are attached in order before the command starts.
pub fn launch(spec: &SandboxSpec, options: &LaunchOptions) -> Result<ExitStatus, LaunchError> {
    if spec.deferred_binds.is_empty() {
        return run(spec, options, None);
    }
    launch_with(spec, options, |ctx| {
        for i in 0..ctx.deferred_binds() {
            ctx.attach(i)?;
        }
        Ok(())
    })
}

/// Like [`launch`], but pauses once the sandbox's root is built and calls
/// `apply` to land inputs in it (see [`ApplyContext`]). If `apply` fails,
/// the sandbox is killed before the command starts and the error is
/// returned as [`LaunchError::Apply`].
pub fn launch_with<F>(
    spec: &SandboxSpec,
    options: &LaunchOptions,
    apply: F,
) -> Result<ExitStatus, LaunchError>
where
    F: FnOnce(&mut ApplyContext<'_>) -> Result<(), ApplyError>,
{
    run(spec, options, Some(Box::new(apply)))
}

fn run(
    spec: &SandboxSpec,
    options: &LaunchOptions,
    apply: Option<ApplyFn<'_>>,
) -> Result<ExitStatus, LaunchError> {
    launch::ensure_single_threaded()?;
    let mut plan = Plan::prepare(spec, options.bwrap_front_end.as_deref())?;
    plan.apply_phase = apply.is_some();
    launch::drop_supplementary_groups();
    let mut server = plan
        .portal
        .as_ref()
        .map(|listener| nested::Server::new(listener, spec, &plan, options.nested_counts_fd));
    let watch = match &mut server {
        Some(server) => Watch::Portal(server),
        None => Watch::Nothing,
    };
    launch::execute(&plan, options, apply, watch)
}
