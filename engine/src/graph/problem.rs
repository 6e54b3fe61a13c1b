//! Problems found in a graph file: each names where (node and field) and what.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One problem in a graph document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// The node the problem belongs to, when it belongs to one.
    pub node: Option<String>,
    /// Where in the document: a JSON path such as `nodes[2].attrs.axis`, or `line 3, column 7`.
    pub field: String,
    /// What is wrong, as a sentence.
    pub message: String,
}

impl Problem {
    /// A problem at a document location, not tied to a node.
    pub fn at(field: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            node: None,
            field: field.into(),
            message: message.into(),
        }
    }

    /// A problem of a node.
    pub fn node(node: &str, field: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            node: Some(node.to_string()),
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node {
            Some(n) => write!(f, "node '{n}', {}: {}", self.field, self.message),
            None => write!(f, "{}: {}", self.field, self.message),
        }
    }
}

/// Every problem found in one pass over a document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{}", self.render())]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    /// One line per problem.
    pub fn render(&self) -> String {
        let lines: Vec<String> = self.0.iter().map(|p| p.to_string()).collect();
        format!(
            "{} problem{} in the graph:\n  {}",
            self.0.len(),
            if self.0.len() == 1 { "" } else { "s" },
            lines.join("\n  ")
        )
    }
}

/// Problems collected up to a cap: past it they are only counted, so no document can make
/// the list (or the memory it takes) grow without bound. [`Collector::finish`] ends the
/// list with one line saying how many were left out.
#[derive(Debug)]
pub(crate) struct Collector {
    problems: Vec<Problem>,
    max: usize,
    dropped: usize,
}

impl Collector {
    /// An empty collector keeping at most `max` problems.
    pub(crate) fn new(max: usize) -> Collector {
        Collector {
            problems: Vec::new(),
            max,
            dropped: 0,
        }
    }

    /// Keeps a problem, or counts it once the cap is reached.
    pub(crate) fn push(&mut self, p: Problem) {
        // The same problem found twice (by two checks) is said once.
        if self.problems.contains(&p) {
            return;
        }
        if self.problems.len() < self.max {
            self.problems.push(p);
        } else {
            self.dropped = self.dropped.saturating_add(1);
        }
    }

    /// Keeps several problems.
    pub(crate) fn extend(&mut self, ps: impl IntoIterator<Item = Problem>) {
        for p in ps {
            self.push(p);
        }
    }

    /// Whether nothing was found.
    pub(crate) fn is_empty(&self) -> bool {
        self.problems.is_empty() && self.dropped == 0
    }

    /// The problems, ending with a note of how many were left out.
    pub(crate) fn finish(mut self) -> Vec<Problem> {
        if self.dropped > 0 {
            self.problems.push(Problem::at(
                "document",
                format!(
                    "{} more problems not listed (at most {} are; max_problems)",
                    self.dropped, self.max
                ),
            ));
        }
        self.problems
    }
}
