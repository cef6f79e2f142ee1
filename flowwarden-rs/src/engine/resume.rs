//! The resume cascade: which positions to try, in which order.

use crate::definition::{ResumeStrategy, StartPosition, StreamDefinition};
use crate::port::StartAt;
use crate::port::{Checkpoint, StoredPosition};

/// Where a candidate position comes from (for metrics and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CandidateKind {
    /// The stored `lastProcessed` token.
    Processed,
    /// The stored `lastSeen` token.
    Seen,
    /// The latest settled position of this process.
    Current,
    /// The head ("now"): no checkpoint, or `start_position = Latest`.
    Head,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Candidate {
    pub(crate) at: StartAt,
    pub(crate) kind: CandidateKind,
}

/// The ordered positions to try; history lost on one moves to the next.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ResumePlan {
    candidates: Vec<Candidate>,
    index: usize,
}

pub(crate) fn start_at(pos: &StoredPosition) -> StartAt {
    if pos.start_after {
        StartAt::StartAfter(pos.token.clone())
    } else {
        StartAt::ResumeAfter(pos.token.clone())
    }
}

impl ResumePlan {
    /// The plan at stream start, per `start_position` and `resume_strategy`.
    pub(crate) fn initial(def: &StreamDefinition, stored: Option<&Checkpoint>) -> Self {
        let head = || Candidate {
            at: StartAt::Now,
            kind: CandidateKind::Head,
        };
        if def.checkpoint.start_position == StartPosition::Latest {
            return Self::of(vec![head()]);
        }
        let processed = stored.and_then(|c| c.last_processed.as_ref());
        let seen = stored.and_then(|c| c.last_seen.as_ref());
        // A stored `lastSeen` that starts after an invalidate was settled: the stream ended
        // there, and resuming before it would replay the invalidate and halt again (checkpoints
        // written before the tracker moved `lastProcessed` past a settled invalidate have it
        // only in `lastSeen`). It comes first whatever the strategy.
        let seen_ends_stream = seen.is_some_and(|s| s.start_after);
        let ordered = match def.checkpoint.resume_strategy {
            ResumeStrategy::ProcessedFirst if !seen_ends_stream => [
                (processed, CandidateKind::Processed),
                (seen, CandidateKind::Seen),
            ],
            ResumeStrategy::SeenFirst | ResumeStrategy::ProcessedFirst => [
                (seen, CandidateKind::Seen),
                (processed, CandidateKind::Processed),
            ],
        };
        let mut candidates: Vec<Candidate> = Vec::new();
        for (pos, kind) in ordered {
            let Some(pos) = pos else { continue };
            let at = start_at(pos);
            if candidates.iter().any(|c| c.at == at) {
                continue;
            }
            candidates.push(Candidate { at, kind });
        }
        if candidates.is_empty() {
            candidates.push(head());
        }
        Self::of(candidates)
    }

    /// Resume from this process's latest settled position (kept until the next re-open, so
    /// with a token of its own rather than one that holds its event).
    pub(crate) fn current(pos: &StoredPosition) -> Self {
        Self::of(vec![Candidate {
            at: start_at(&pos.detached()),
            kind: CandidateKind::Current,
        }])
    }

    fn of(candidates: Vec<Candidate>) -> Self {
        Self {
            candidates,
            index: 0,
        }
    }

    /// The candidate to try now, or `None` when every one has lost its history.
    pub(crate) fn candidate(&self) -> Option<&Candidate> {
        self.candidates.get(self.index)
    }

    /// Moves past a candidate whose history is lost; returns the next one.
    pub(crate) fn advance(&mut self) -> Option<&Candidate> {
        self.index += 1;
        self.candidate()
    }

    /// Replaces the plan by one explicit position (after `on_history_lost` chose one).
    pub(crate) fn replace(&mut self, at: StartAt) {
        *self = Self::of(vec![Candidate {
            at,
            kind: CandidateKind::Head,
        }]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::{CheckpointConfig, RestartConfig, RetryConfig, SourceLocation};
    use crate::event::ResumeToken;

    fn def(strategy: ResumeStrategy, start: StartPosition) -> StreamDefinition {
        StreamDefinition {
            name: "s",
            type_name: "S",
            database: None,
            collection: "c",
            full_document: Default::default(),
            full_document_before_change: Default::default(),
            enabled: true,
            auto_start: true,
            checkpoint: CheckpointConfig {
                resume_strategy: strategy,
                start_position: start,
                ..CheckpointConfig::DEFAULT
            },
            retry: RetryConfig::DEFAULT,
            restart: RestartConfig::DEFAULT,
            deployment: crate::definition::Deployment::AllInstances,
            concurrency: crate::ConcurrencyConfig::DEFAULT,
            transactional: false,
            source: SourceLocation { file: "f", line: 1 },
        }
    }

    fn pos(d: &str) -> StoredPosition {
        StoredPosition {
            token: ResumeToken::from_document(bson::doc! {"_data": d}),
            cluster_time: None,
            wall_time: None,
            start_after: false,
        }
    }

    fn cp() -> Checkpoint {
        Checkpoint {
            stream: "s".into(),
            last_processed: Some(pos("01")),
            last_seen: Some(pos("05")),
            owner: None,
            epoch: None,
            updated_at: bson::DateTime::from_millis(0),
            snapshot: None,
        }
    }

    #[test]
    fn processed_first_then_seen() {
        let mut p = ResumePlan::initial(
            &def(ResumeStrategy::ProcessedFirst, StartPosition::Resume),
            Some(&cp()),
        );
        assert_eq!(
            p.candidate().map(|c| c.kind),
            Some(CandidateKind::Processed)
        );
        assert_eq!(p.advance().map(|c| c.kind), Some(CandidateKind::Seen));
        assert_eq!(p.advance(), None);
    }

    #[test]
    fn seen_first_then_processed() {
        let mut p = ResumePlan::initial(
            &def(ResumeStrategy::SeenFirst, StartPosition::Resume),
            Some(&cp()),
        );
        assert_eq!(p.candidate().map(|c| c.kind), Some(CandidateKind::Seen));
        assert_eq!(p.advance().map(|c| c.kind), Some(CandidateKind::Processed));
    }

    #[test]
    fn no_checkpoint_or_latest_starts_at_head() {
        let p = ResumePlan::initial(&def(ResumeStrategy::SeenFirst, StartPosition::Resume), None);
        assert_eq!(p.candidate().map(|c| &c.at), Some(&StartAt::Now));
        let p = ResumePlan::initial(
            &def(ResumeStrategy::SeenFirst, StartPosition::Latest),
            Some(&cp()),
        );
        assert_eq!(p.candidate().map(|c| &c.at), Some(&StartAt::Now));
    }

    #[test]
    fn a_seen_invalidate_comes_first_under_both_strategies() {
        let mut c = cp();
        if let Some(seen) = c.last_seen.as_mut() {
            seen.start_after = true;
        }
        for strategy in [ResumeStrategy::ProcessedFirst, ResumeStrategy::SeenFirst] {
            let p = ResumePlan::initial(&def(strategy, StartPosition::Resume), Some(&c));
            let first = p.candidate().expect("a candidate");
            assert_eq!(first.kind, CandidateKind::Seen, "{strategy:?}");
            assert!(matches!(first.at, StartAt::StartAfter(_)), "{strategy:?}");
        }
    }

    #[test]
    fn equal_tokens_are_tried_once() {
        let mut c = cp();
        c.last_seen = c.last_processed.clone();
        let mut p = ResumePlan::initial(
            &def(ResumeStrategy::ProcessedFirst, StartPosition::Resume),
            Some(&c),
        );
        assert!(p.candidate().is_some());
        assert_eq!(p.advance(), None);
    }
}
