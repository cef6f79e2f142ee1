//! The simulated stream: its document type, definition and handler, whose behaviour comes
//! from the schedule and whose every call is recorded. In a transactional schedule the handler
//! takes its transaction (`ctx.transaction::<MemoryTransaction>()`) and writes the event's
//! effect through it before it behaves as drawn; its success is then pending until the commit.

use flowwarden::port::HandleType;
use flowwarden::MemoryTransaction;

use super::transactions::{Pending, Subject};
use super::*;

/// The document type of the simulated stream (a document with `n` of another type does not
/// decode).
#[derive(Debug, Clone, Deserialize)]
pub struct Item {
    /// A number.
    pub n: i64,
    /// A status.
    #[serde(default)]
    pub status: String,
}

thread_local! {
    static PIPELINE: std::cell::RefCell<Vec<Document>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub(crate) fn set_pipeline(kind: PipelineKind) {
    let stages = match kind {
        PipelineKind::None => vec![],
        PipelineKind::NoDeletes => {
            vec![bson::doc! {"$match": {"operationType": {"$nin": ["delete"]}}}]
        }
        PipelineKind::NotKey(k) => vec![bson::doc! {"$match": {"documentKey._id": {"$ne": k}}}],
        PipelineKind::NotHidden => {
            vec![bson::doc! {"$match": {"fullDocument.status": {"$ne": "hidden"}}}]
        }
    };
    PIPELINE.with(|p| *p.borrow_mut() = stages);
}

pub(crate) static DEFAULT_DEF: StreamDefinition = StreamDefinition {
    name: crate::STREAM,
    type_name: "SimHandler",
    database: None,
    collection: crate::COLLECTION,
    full_document: flowwarden::FullDocument::Default,
    full_document_before_change: flowwarden::FullDocumentBeforeChange::Off,
    enabled: true,
    auto_start: true,
    checkpoint: flowwarden::CheckpointConfig::DEFAULT,
    retry: flowwarden::RetryConfig::DEFAULT,
    restart: flowwarden::RestartConfig::DEFAULT,
    deployment: flowwarden::Deployment::AllInstances,
    concurrency: flowwarden::ConcurrencyConfig::DEFAULT,
    transactional: false,
    source: flowwarden::SourceLocation {
        file: file!(),
        line: line!(),
    },
};

/// The panic message of injected panics (the harness's panic hook keeps them quiet).
pub(crate) const PANIC_MARK: &str = "flowwarden-simulation: injected handler panic";

/// The simulated handler: behaviour from the schedule, every call recorded.
#[derive(Clone)]
pub(crate) struct SimHandler {
    pub(crate) world: Arc<World>,
    /// The runtime (incarnation) it belongs to.
    pub(crate) inc: u32,
}

/// The `#[filter]` on a snapshot read: the schedule's filter (the document's status), and
/// invariant 9 on its first attempt with several runtimes.
fn snapshot_filter(w: &mut WorldState, inc: u32, ctx: &ChangeContext<Item>) -> bool {
    let Some(k) = key_of(ctx) else {
        return true;
    };
    // A transaction run again after a transient error calls the filter again with attempt 1:
    // the read it had in processing, not a new one.
    let rerun = w.transaction_rerun(inc, Subject::Read(k));
    if (w.settings.leader.is_some() || w.settings.shared_checkpoint) && ctx.attempt() == 1 && !rerun
    {
        w.check_consumer(inc, &format!("the snapshot read of k{k}"));
    }
    let keep = match w.settings.filter {
        FilterKind::NotQuiet => ctx.document().is_none_or(|d| d.status != "quiet"),
        FilterKind::None | FilterKind::NoUpdatesOf(_) => true,
    };
    if !keep {
        let tag = w.tag(inc);
        w.log(format!("{tag}filter rejects the snapshot read of k{k}"));
        w.settle_snapshot_read(k, Settle::Filtered);
    }
    keep
}

enum Outcome {
    Ok,
    Fail(&'static str),
    Panic,
    DeadLetterRequest,
}

pub(crate) fn key_of<T>(ctx: &ChangeContext<T>) -> Option<i32> {
    match ctx.document_key()?.get("_id")? {
        Bson::Int32(k) => Some(*k),
        Bson::Int64(k) => Some(*k as i32),
        _ => None,
    }
}

impl StreamHandler for SimHandler {
    type Document = Item;

    fn definition() -> &'static StreamDefinition {
        &DEFAULT_DEF
    }

    fn pipeline() -> Vec<Document> {
        PIPELINE.with(|p| p.borrow().clone())
    }

    fn transaction_types() -> Vec<HandleType> {
        vec![HandleType::of::<MemoryTransaction>()]
    }

    fn filter(&self, ctx: &ChangeContext<Item>) -> bool {
        let mut w = self.world.lock();
        if ctx.is_snapshot() {
            return snapshot_filter(&mut w, self.inc, ctx);
        }
        if (w.settings.leader.is_some() || w.settings.shared_checkpoint) && ctx.attempt() == 1 {
            if let Some(seq) = token_seq(ctx.resume_token()) {
                // A transaction run again after a transient error calls the filter again with
                // attempt 1: the event it has in processing, not a new one.
                if !w.transaction_rerun(self.inc, Subject::Change(seq)) {
                    w.check_consumer(self.inc, &format!("#{seq}"));
                }
            }
        }
        let key = key_of(ctx);
        if let Some(seq) = token_seq(ctx.resume_token()) {
            w.on_begin(self.inc, seq, key);
        }
        let keep = match w.settings.filter {
            FilterKind::None => true,
            FilterKind::NoUpdatesOf(k) => {
                !(key == Some(k) && ctx.operation_type().as_str() == "update")
            }
            FilterKind::NotQuiet => ctx.document().is_none_or(|d| d.status != "quiet"),
        };
        if !keep {
            if let Some(seq) = token_seq(ctx.resume_token()) {
                let tag = w.tag(self.inc);
                w.log(format!("{tag}filter rejects #{seq}"));
                w.settle(seq, Settle::Filtered);
            }
        }
        keep
    }

    fn handle(self: Arc<Self>, ctx: Arc<ChangeContext<Item>>) -> Option<HandlerFuture> {
        let op = ctx.operation_type().as_str().to_owned();
        let key = key_of(&ctx);
        let mut w = self.world.lock();
        let inc = self.inc;
        let tag = w.tag(inc);
        // A snapshot read has no oplog position: its key names it.
        let subject = if ctx.is_snapshot() {
            Subject::Read(key?)
        } else {
            Subject::Change(token_seq(ctx.resume_token())?)
        };
        if let Subject::Change(seq) = subject {
            if op == "drop" || op == "invalidate" {
                w.log(format!("{tag}unrouted #{seq} {op}"));
                w.settle(seq, Settle::Unrouted);
                if op == "drop" {
                    w.project_drop(seq);
                }
                return None;
            }
        }
        let (call, h, min_latency) = match subject {
            Subject::Change(seq) => {
                let c = w.calls.entry(seq).or_insert(0);
                *c += 1;
                let call = *c - 1;
                let h = mix(w.seed
                    ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    ^ u64::from(call).wrapping_mul(0xC2B2_AE3D_27D4_EB4F));
                (call, h, 0)
            }
            Subject::Read(k) => {
                let call = w.snapshot_call(k);
                let h = mix(w.seed
                    ^ 0x5CA1_AB1E_0000_0000
                    ^ u64::from(k as u32).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    ^ u64::from(call).wrapping_mul(0xC2B2_AE3D_27D4_EB4F));
                let min = w
                    .settings
                    .snapshot
                    .as_ref()
                    .map_or(0, |s| s.read_latency_ms);
                (call, h, min)
            }
        };
        let b = &w.settings.behaviour;
        let latency = min_latency
            + if b.max_latency_ms == 0 {
                0
            } else {
                h % (b.max_latency_ms + 1)
            };
        let outcome = if key.is_some_and(|k| b.permanent_keys.contains(&k)) {
            Outcome::Fail("permanent failure")
        } else if call < b.transient_calls && (h >> 20) % 100 < b.transient_pct {
            Outcome::Fail("transient failure")
        } else if call < 2 && (h >> 30) % 100 < b.panic_pct {
            Outcome::Panic
        } else if (h >> 40) % 100 < b.dead_letter_request_pct {
            Outcome::DeadLetterRequest
        } else {
            Outcome::Ok
        };
        w.stats.invocations += 1;
        let label = subject.to_string();
        let second_write = w.settings.transactional.as_ref().map(|t| t.second_write);
        let tx = ctx.transaction::<MemoryTransaction>();
        if second_write.is_some() && tx.is_none() {
            w.violate(
                Invariant::EffectsExactlyOnce,
                format!("{tag}the handler of {label} runs without a transaction handle"),
            );
        }
        w.log(format!(
            "{tag}invoke {label} {op} k{} attempt {} (call {call}, {latency}ms)",
            key.unwrap_or(-1),
            ctx.attempt()
        ));
        drop(w);
        let world = self.world.clone();
        Some(Box::pin(async move {
            if latency > 0 {
                tokio::time::sleep(Duration::from_millis(latency)).await;
            }
            // A zombie: the handler stalls (a GC pause, a blocked call) past its lease.
            let mut stalled = false;
            loop {
                let until = {
                    let mut w = world.lock();
                    let until = w.stall_until.get(&inc).copied();
                    match until {
                        Some(u) if u > Instant::now() => {
                            let at = u.saturating_duration_since(w.t0).as_millis();
                            w.log(format!("{tag}handler of {label} stalls until {at}ms"));
                            Some(u)
                        }
                        _ => None,
                    }
                };
                match until {
                    Some(u) => {
                        stalled = true;
                        tokio::time::sleep_until(u).await;
                    }
                    None => break,
                }
            }
            let mut w = world.lock();
            if stalled {
                let deposed = !w.leads(inc);
                if deposed {
                    w.stats.zombie_wakeups += 1;
                }
                w.log(format!(
                    "{tag}handler of {label} wakes{}",
                    if deposed {
                        " (a zombie: this runtime no longer holds the lease)"
                    } else {
                        ""
                    }
                ));
            }
            // The effect first, whatever the outcome: a failing attempt's writes are aborted.
            if let (Some(tx), Some(second)) = (&tx, second_write) {
                if let Err(e) = write_effect(tx, subject, second) {
                    w.log(format!("{tag}fail {label}: the effect write failed: {e}"));
                    return Err(HandlerError::msg(format!("effect write of {label}: {e}")));
                }
            }
            match outcome {
                Outcome::Ok if second_write.is_some() => {
                    w.log(format!(
                        "{tag}success {label} (its transaction's commit decides)"
                    ));
                    let event = match subject {
                        Subject::Change(_) => ctx.raw_event().clone(),
                        Subject::Read(_) => {
                            ctx.event().full_document().cloned().unwrap_or_default()
                        }
                    };
                    w.on_transactional_success(
                        inc,
                        Pending {
                            subject,
                            key,
                            event,
                        },
                    );
                    Ok(())
                }
                Outcome::Ok => {
                    w.log(format!("{tag}success {label}"));
                    match subject {
                        Subject::Change(seq) => {
                            w.on_success(seq, key);
                            w.project_change(seq, key, ctx.raw_event());
                        }
                        Subject::Read(k) => {
                            let doc = ctx.event().full_document().cloned().unwrap_or_default();
                            w.on_snapshot_success(k, &doc);
                        }
                    }
                    Ok(())
                }
                Outcome::Fail(why) => {
                    w.log(format!("{tag}fail {label}: {why}"));
                    Err(HandlerError::msg(format!("{why} of {label}")))
                }
                Outcome::DeadLetterRequest => {
                    w.log(format!("{tag}{label}: handler asks to dead-letter"));
                    ctx.dead_letter("the simulated handler asked for it");
                    Ok(())
                }
                Outcome::Panic => {
                    w.log(format!("{tag}panic {label}"));
                    drop(w);
                    panic!("{PANIC_MARK} {label}");
                }
            }
        }))
    }

    fn on_error(&self, error: &HandlerError, _ctx: &ChangeContext<Item>) -> Option<ErrorAction> {
        let w = self.world.lock();
        (w.settings.behaviour.dead_letter_permanent_at_once
            && error.to_string().starts_with("permanent"))
        .then_some(ErrorAction::DeadLetter)
    }
}

/// Writes the effect of `subject` through the transaction: its counter in `effects` and, with
/// `second`, the running total.
fn write_effect(
    tx: &MemoryTransaction,
    subject: Subject,
    second: bool,
) -> Result<(), flowwarden::MemoryError> {
    let inc = bson::doc! {"$inc": {"n": 1}};
    tx.upsert_one(
        super::EFFECTS,
        bson::doc! {"_id": subject.effect_id()},
        inc.clone(),
    )?;
    if second {
        tx.upsert_one(super::TOTALS, bson::doc! {"_id": "all"}, inc)?;
    }
    Ok(())
}
