//! A job's task: it waits for a slot, runs one turn of the engine in its
//! sandbox (the whole job for an auto job; until the engine asks, for a
//! resumable interactive one; the whole conversation for a sticky one),
//! and records the outcome.
//!
//! Limits while the engine runs: the job's time limit (`--job-timeout`,
//! or less by `runtime_options.hard_timeout_seconds`), then SIGTERM into
//! the sandbox and SIGKILL after `--kill-grace`; the same for a cancel.
//! While a sticky engine waits for its user, the time limit stands still
//! and the wait has its own (`session_timeout_sec`); the sandbox, its
//! slot and everything else stay as they were.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::conversation::WaitEnd;
use super::engines::{self, Engine};
use super::interaction::{self, session_timeout};
use super::jobs::{Direct, Job, Service};
use super::logcap::Line;
use super::package::Skill;
use super::run::{self, Outcome, Prepared, Proc, RunContext, RunPaths, Stop, Streams};
use super::store::{InteractionState, JobRecord, Profile, Status, TakenReply};
use super::temp;

/// How a turn ended, for [`run::finish`].
struct Ended {
    stop: Stop,
    /// Where the answer starts in what the engine wrote this turn: 0, or
    /// after a sticky engine's last question.
    answer_pos: u64,
}

impl Service {
    /// The job's task: wait for a slot (unless `direct` brings one), run
    /// a turn, record the outcome.
    pub(super) async fn run_job(self: Arc<Self>, job: Arc<Job>, direct: Option<Direct>) {
        let mut cancel = job.cancel.subscribe();
        let (permit, saved) = match direct {
            Some(Direct { permit, saved }) => (Some(permit), Some(saved)),
            None => {
                let permit = tokio::select! {
                    permit = Arc::clone(&self.slots).acquire_owned() => permit.ok(),
                    _ = cancel.wait_for(|c| *c) => None,
                };
                (permit, None)
            }
        };
        let record = job.record();
        let paths = self.run_paths(record.run_id.as_deref().unwrap_or("missing"));
        let outcome = match permit {
            None => run::write_canceled(&paths),
            Some(_permit) if record.cancel_requested => run::write_canceled(&paths),
            Some(_permit) => {
                let running = async {
                    let r = self
                        .update(&job, |r| {
                            if r.status == Some(Status::Queued) {
                                r.status = Some(Status::Running);
                            }
                        })
                        .await;
                    if let Some(saved) = saved {
                        let _ = saved.send(());
                    }
                    r
                };
                let skill = job.skill.lock().unwrap().clone();
                self.execute(&job, &record, skill, &paths, cancel, running).await
            }
        };
        self.active.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.record_outcome(&job, outcome, &paths).await;
    }

    /// The result-cache entry a turn's success makes (none for a failure,
    /// a job without a cache key, or one answered from the cache), listed
    /// off the event loop.
    async fn cache_entry(
        self: &Arc<Self>,
        before: &JobRecord,
        outcome: &Outcome,
    ) -> Option<crate::skills::cache::Entry> {
        let (Outcome::Succeeded { warnings }, Some(key), Some(run_id)) =
            (outcome, &before.cache_key, &before.run_id)
        else {
            return None;
        };
        if before.cache_hit {
            return None;
        }
        let (svc, key, run_id, id, warnings) =
            (Arc::clone(self), key.clone(), run_id.clone(), before.request_id.clone(), warnings.clone());
        tokio::task::spawn_blocking(move || svc.cache.entry_for(&key, &run_id, &id, &warnings)).await.ok()
    }

    /// Writes the outcome of a turn: terminal (the engine's home removed,
    /// a success cached), or a resumable job waiting for its user (its
    /// home kept for the next turn, its wait timer armed).
    async fn record_outcome(self: &Arc<Self>, job: &Arc<Job>, outcome: Outcome, paths: &RunPaths) {
        let canceled = json!({"code": "CANCELED_BY_USER", "message": "Canceled by user request"});
        let before = job.record();
        let timeout = session_timeout(&before);
        // A terminal turn removes the home (it may hold credentials) before
        // its status is written: a client that sees the end must not find
        // the home still there.
        let waiting = matches!(outcome, Outcome::Waiting { .. });
        if !waiting {
            run::cleanup(paths);
        }
        let entry = self.cache_entry(&before, &outcome).await;
        let record = self
            .update_after(
                job,
                |r| {
                    let outcome = if r.cancel_requested { Outcome::Canceled } else { outcome };
                    match outcome {
                        Outcome::Succeeded { warnings } => {
                            r.status = Some(Status::Succeeded);
                            r.warnings = warnings;
                            r.error = None;
                            if let Some(entry) = &entry {
                                self.cache.remember(entry.clone());
                            }
                        }
                        Outcome::Failed { error, warnings } => {
                            r.status = Some(Status::Failed);
                            r.warnings = warnings;
                            r.error = Some(error);
                        }
                        Outcome::Canceled => {
                            r.status = Some(Status::Canceled);
                            r.error = Some(canceled);
                        }
                        Outcome::Waiting { pending, session } => {
                            r.status = Some(Status::WaitingUser);
                            let i = r
                                .interaction
                                .get_or_insert_with(|| InteractionState::new(Profile::Resumable));
                            i.pending = Some(pending);
                            i.session = session;
                            i.asked += 1;
                            i.next = None;
                            i.wait_deadline_ms =
                                Some(super::store::now_ms().saturating_add(timeout.as_millis() as u64));
                            return;
                        }
                    }
                    if let Some(i) = r.interaction.as_mut() {
                        i.pending = None;
                        i.next = None;
                        i.wait_deadline_ms = None;
                    }
                },
                Some(paths.result.clone()),
            )
            .await;
        if record.status == Some(Status::WaitingUser) {
            self.arm_wait(Arc::clone(job));
            return;
        }
        if waiting {
            // Canceled as it began to wait.
            run::cleanup(paths);
        }
        let Some(entry) = entry else { return };
        if record.status != Some(Status::Succeeded) {
            // Canceled as it ended: never answered from the cache.
            self.cache.forget(&entry.key, &entry.run_id);
            return;
        }
        let svc = Arc::clone(self);
        let id = record.request_id.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || svc.cache.persist(&entry)).await {
            tracing::warn!("job {id}: the cache entry was not written: {e}");
        }
    }

    /// Runs one turn of the job's engine. `running` records the job as
    /// running; the engine starts only once it is on disk (a restart must
    /// not run it a second time), but the run is prepared while it is
    /// being written.
    async fn execute(
        &self,
        job: &Arc<Job>,
        record: &JobRecord,
        skill: Option<Arc<Skill>>,
        paths: &RunPaths,
        cancel: watch::Receiver<bool>,
        running: impl std::future::Future<Output = JobRecord>,
    ) -> Outcome {
        let t0 = std::time::Instant::now();
        let (running, skill) = match skill {
            Some(skill) => (Some(running), Ok(skill)),
            // Loading the package again (after a restart) is rare: in turn.
            None => {
                running.await;
                (None, self.reload_skill(record).await)
            }
        };
        let skill = match skill {
            Ok(s) => s,
            Err(message) => return Outcome::failed(message),
        };
        let Some(engine) = self.cfg.engines.get(&record.engine).cloned() else {
            if let Some(running) = running {
                running.await;
            }
            return Outcome::failed(format!("engine '{}' is not configured on this server", record.engine));
        };
        let prepare = self.prepare(record, &skill, &engine, paths);
        let prepared = match running {
            Some(running) => tokio::join!(running, prepare).1,
            None => prepare.await,
        };
        let prepared = match prepared {
            Ok(p) => p,
            Err(outcome) => return outcome,
        };
        let t_prepared = t0.elapsed();
        let profile = record.interaction.as_ref().map(|i| i.profile);
        let sticky = profile == Some(Profile::StickyProcess);
        let streams = Streams { stdin: sticky, asks: sticky, max_log: self.cfg.limits.max_log };
        let mut proc = match run::spawn(&self.cfg.launcher, paths, &prepared, streams) {
            Ok(p) => p,
            Err(e) => return Outcome::failed(e.to_string()),
        };
        let ended = self.supervise(job, &engine, &mut proc, prepared.timeout, cancel).await;
        let t_ran = t0.elapsed();
        let logs = proc.logs().await;
        let (ended, stdout) = match (ended, logs) {
            (Ok(ended), Ok((stdout, _))) => (ended, stdout),
            (Err(e), _) => return Outcome::failed(e.to_string()),
            (_, Err(e)) => return Outcome::failed(format!("the engine's logs: {e}")),
        };
        let (cfg, record2, paths2) = (self.cfg.clone(), record.clone(), paths.clone());
        let outcome = tokio::task::spawn_blocking(move || {
            let cx = RunContext {
                skill: &skill,
                engine: &engine,
                record: &record2,
                paths: &paths2,
                limits: &cfg.limits,
                host_ids: cfg.host_ids,
                interactive: profile,
            };
            run::finish(&cx, ended.stop, prepared.timeout, stdout.file_offset(ended.answer_pos))
        })
        .await
        .unwrap_or_else(|e| Outcome::failed(e.to_string()));
        tracing::debug!(
            "job {}: prepared in {:?}, engine and sandbox {:?}, finished in {:?}",
            record.request_id,
            t_prepared,
            t_ran - t_prepared,
            t0.elapsed() - t_ran
        );
        outcome
    }

    /// The package of a job whose task starts after a restart.
    async fn reload_skill(&self, record: &JobRecord) -> Result<Arc<Skill>, String> {
        if record.temp {
            let (dir, id, engines) =
                (self.request_dir(&record.request_id), record.skill_id.clone(), self.engine_names());
            return match tokio::task::spawn_blocking(move || temp::load(&dir, &id, &engines)).await {
                Ok(Ok(s)) => Ok(Arc::new(s)),
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(e.to_string()),
            };
        }
        self.load_skill(&record.skill_id, &format!("Skill '{}' not found", record.skill_id))
            .await
            .map(Arc::new)
            .map_err(|e| e.to_string())
    }

    /// Prepares the turn: the first (the run directory, the inputs, the
    /// prompt), or a resumable engine's next, with the reply it waits for.
    async fn prepare(
        &self,
        record: &JobRecord,
        skill: &Arc<Skill>,
        engine: &Engine,
        paths: &RunPaths,
    ) -> Result<Prepared, Outcome> {
        let (cfg, record, paths, skill, engine) =
            (self.cfg.clone(), record.clone(), paths.clone(), Arc::clone(skill), engine.clone());
        tokio::task::spawn_blocking(move || {
            let interaction = record.interaction.as_ref();
            let cx = RunContext {
                skill: &skill,
                engine: &engine,
                record: &record,
                paths: &paths,
                limits: &cfg.limits,
                host_ids: cfg.host_ids,
                interactive: interaction.map(|i| i.profile),
            };
            match interaction.and_then(|i| Some((i.next.as_ref()?, i.session.as_deref()))) {
                None => run::prepare(&cx),
                Some((reply, Some(session))) => run::prepare_resume(&cx, reply, session),
                Some((_, None)) => Err(Outcome::coded("SESSION_RESUME_FAILED", "no session to resume")),
            }
        })
        .await
        .unwrap_or_else(|e| Err(Outcome::failed(e.to_string())))
    }

    /// Watches the engine until it exits: its time limit, a cancel, and
    /// for a sticky engine its questions, the replies and the waits.
    async fn supervise(
        &self,
        job: &Arc<Job>,
        engine: &Engine,
        proc: &mut Proc,
        timeout: Duration,
        mut cancel: watch::Receiver<bool>,
    ) -> Result<Ended, run::RunError> {
        let signal = proc.signaller();
        let grace = self.cfg.limits.kill_grace;
        let Proc { child, stdin, asks, .. } = proc;
        let mut clock = Clock { deadline: Instant::now() + timeout, left: Duration::ZERO };
        let mut stop = None;
        let mut answer_pos = 0;
        let mut wait: Option<Waiting> = None;
        let status = loop {
            let (until, replies) = match wait.as_mut() {
                Some(w) => (w.until, Some(&mut w.replies)),
                None => (None, None),
            };
            let waiting = replies.is_some();
            tokio::select! {
                status = child.wait() => break status,
                () = tokio::time::sleep_until(clock.deadline), if stop.is_none() && !waiting => {
                    halt(&mut stop, Stop::TimedOut, signal);
                }
                changed = cancel.changed(), if stop.is_none() => {
                    if changed.is_err() || *cancel.borrow() {
                        halt(&mut stop, Stop::Canceled, signal);
                    }
                }
                line = next(asks.as_mut()), if stop.is_none() && !waiting => match line {
                    None => *asks = None,
                    Some(line) => if let Some(pending) = question(engine, &line) {
                        let (tx, replies) = mpsc::channel(1);
                        let until = self.enter_wait(job, pending, tx).await;
                        clock.pause();
                        wait = Some(Waiting { until: Some(until), replies });
                        answer_pos = line.end;
                    },
                },
                reply = next(replies), if stop.is_none() => {
                    if let Some(reply) = reply {
                        give(stdin, &reply).await;
                    }
                    wait = None;
                    clock.resume();
                }
                () = sleep_until(until), if stop.is_none() => {
                    let id = job.record().interaction.and_then(|i| i.pending_id()).unwrap_or(0);
                    match self.wait_over(job, id).await {
                        WaitEnd::Reply(reply) => {
                            give(stdin, &reply).await;
                            wait = None;
                            clock.resume();
                        }
                        WaitEnd::Expired => halt(&mut stop, Stop::WaitTimedOut, signal),
                        // The reply is in the channel: the next turn of
                        // the loop takes it.
                        WaitEnd::Replied => wait.iter_mut().for_each(|w| w.until = None),
                    }
                }
                () = tokio::time::sleep(grace), if stop.is_some() => signal.send(libc::SIGKILL),
            }
        };
        // No reply may be taken for an engine that is gone.
        {
            let _order = job.persist.lock().await;
            job.sticky.lock().unwrap().take();
        }
        let status = status.map_err(run::RunError::Wait)?;
        let stop = match (stop, wait) {
            (Some(stop), _) => stop,
            (None, Some(_)) => Stop::ProcessLost,
            (None, None) => Stop::Exited(run::exit_code(status)),
        };
        Ok(Ended { stop, answer_pos })
    }
}

/// A sticky engine's question waiting for its reply: until when (none
/// once a reply is on its way), and where replies come from.
struct Waiting {
    until: Option<Instant>,
    replies: mpsc::Receiver<TakenReply>,
}

/// The engine's time limit, which stands still while a question waits.
struct Clock {
    deadline: Instant,
    /// Time left when the wait began.
    left: Duration,
}

impl Clock {
    fn pause(&mut self) {
        self.left = self.deadline.saturating_duration_since(Instant::now());
    }

    fn resume(&mut self) {
        self.deadline = Instant::now() + self.left;
    }
}

/// Stops the engine (SIGTERM into the sandbox) for `why`.
fn halt(stop: &mut Option<Stop>, why: Stop, signal: run::Signaller) {
    *stop = Some(why);
    signal.send(libc::SIGTERM);
}

/// The next item of an optional channel; never, without one.
async fn next<T>(rx: Option<&mut mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(until: Option<Instant>) {
    match until {
        Some(until) => tokio::time::sleep_until(until).await,
        None => std::future::pending().await,
    }
}

/// A sticky engine's question in one line of its output, if it is one.
fn question(engine: &Engine, line: &Line) -> Option<Value> {
    let text = String::from_utf8_lossy(&line.text);
    let (answer, _) = engine.answer(&text).ok()?;
    let (value, _) = engines::extract_json(&answer)?;
    interaction::pending_of(&value)
}

/// Writes a reply to a sticky engine's stdin. An engine that closed its
/// stdin is not waiting any more; what it does next decides its outcome.
async fn give(stdin: &mut Option<tokio::process::ChildStdin>, reply: &TakenReply) {
    use tokio::io::AsyncWriteExt;
    if let Some(pipe) = stdin.as_mut()
        && let Err(e) = pipe.write_all(interaction::sticky_line(reply).as_bytes()).await
    {
        tracing::warn!("cannot give the reply to the engine: {e}");
        *stdin = None;
    }
}
