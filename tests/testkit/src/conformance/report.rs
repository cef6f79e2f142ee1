//! What a run of the suite found: one outcome per case.

use std::fmt;

/// The outcome of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every check of the case held.
    Passed,
    /// A check failed (or the case panicked or timed out): what was expected and what was
    /// found.
    Failed(String),
    /// The case could not run on this target, and why (a store the backend does not have, a
    /// fault the target cannot inject). Never a silent pass.
    NotApplicable(String),
}

/// One case and its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseOutcome {
    /// The case's name, `area.case` (see [`crate::conformance::CASES`]).
    pub case: &'static str,
    /// What happened.
    pub outcome: Outcome,
}

/// The outcomes of every case of one run, in the order they ran.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// One entry per case.
    pub cases: Vec<CaseOutcome>,
}

impl Report {
    pub(crate) fn push(&mut self, case: &'static str, outcome: Outcome) {
        self.cases.push(CaseOutcome { case, outcome });
    }

    fn names(&self, pred: impl Fn(&Outcome) -> bool) -> Vec<&'static str> {
        self.cases
            .iter()
            .filter(|c| pred(&c.outcome))
            .map(|c| c.case)
            .collect()
    }

    /// The cases that passed.
    pub fn passed(&self) -> Vec<&'static str> {
        self.names(|o| matches!(o, Outcome::Passed))
    }

    /// The cases that failed.
    pub fn failed(&self) -> Vec<&'static str> {
        self.names(|o| matches!(o, Outcome::Failed(_)))
    }

    /// The cases that were not applicable to the target.
    pub fn not_applicable(&self) -> Vec<&'static str> {
        self.names(|o| matches!(o, Outcome::NotApplicable(_)))
    }

    /// The outcome of `case`, if it ran.
    pub fn outcome(&self, case: &str) -> Option<&Outcome> {
        self.cases
            .iter()
            .find(|c| c.case == case)
            .map(|c| &c.outcome)
    }

    /// Whether no case failed.
    pub fn is_success(&self) -> bool {
        self.failed().is_empty()
    }

    /// Panics with every failed case and its message when one failed.
    pub fn assert_no_failure(&self) {
        if !self.is_success() {
            panic!("{self}");
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failed = self.failed().len();
        let na = self.not_applicable().len();
        writeln!(
            f,
            "backend conformance: {} case(s), {} passed, {failed} failed, {na} not applicable",
            self.cases.len(),
            self.passed().len(),
        )?;
        for c in &self.cases {
            match &c.outcome {
                Outcome::Passed => {}
                Outcome::Failed(why) => writeln!(f, "  FAILED {}: {why}", c.case)?,
                Outcome::NotApplicable(why) => writeln!(f, "  not applicable {}: {why}", c.case)?,
            }
        }
        Ok(())
    }
}
