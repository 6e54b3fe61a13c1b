//! Undo and redo: snapshots of the whole document. Every edit records the state before
//! it; undo steps back to exactly that state and redo forward again.

use sluice_engine::graph::GraphDoc;

/// Most edits remembered.
const DEPTH: usize = 500;

/// The undo and redo stacks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    past: Vec<GraphDoc>,
    future: Vec<GraphDoc>,
}

impl History {
    /// Records `before`, the state an edit is about to change; clears what could be redone.
    pub fn record(&mut self, before: GraphDoc) {
        if self.past.last() == Some(&before) {
            return;
        }
        self.past.push(before);
        if self.past.len() > DEPTH {
            self.past.remove(0);
        }
        self.future.clear();
    }

    /// The state before the last edit, given the current one (kept for redo).
    pub fn undo(&mut self, current: &GraphDoc) -> Option<GraphDoc> {
        let previous = self.past.pop()?;
        self.future.push(current.clone());
        Some(previous)
    }

    /// The state the last undo left, given the current one.
    pub fn redo(&mut self, current: &GraphDoc) -> Option<GraphDoc> {
        let next = self.future.pop()?;
        self.past.push(current.clone());
        Some(next)
    }

    /// Whether there is something to undo.
    pub fn can_undo(&self) -> bool {
        !self.past.is_empty()
    }

    /// Whether there is something to redo.
    pub fn can_redo(&self) -> bool {
        !self.future.is_empty()
    }

    /// Forgets everything (a different graph was opened).
    pub fn clear(&mut self) {
        self.past.clear();
        self.future.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model;

    #[test]
    fn undo_and_redo_restore_exact_states() {
        let mut h = History::default();
        let s0 = model::empty("g");
        let mut s1 = s0.clone();
        model::add_input(&mut s1, [1.0, 2.0]);
        h.record(s0.clone());
        let mut s2 = s1.clone();
        model::add_op(&mut s2, "relu", 1, [3.0, 4.0]);
        h.record(s1.clone());
        assert_eq!(h.undo(&s2), Some(s1.clone()));
        assert_eq!(h.undo(&s1), Some(s0.clone()));
        assert_eq!(h.undo(&s0), None);
        assert_eq!(h.redo(&s0), Some(s1.clone()));
        assert_eq!(h.redo(&s1), Some(s2.clone()));
        assert!(!h.can_redo());
        // A new edit after an undo drops the redo branch.
        h.undo(&s2);
        h.record(s1.clone());
        assert!(!h.can_redo());
    }
}
