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
