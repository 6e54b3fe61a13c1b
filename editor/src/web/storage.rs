//! The draft in local storage: the document as it is after every edit, so that a closed
//! tab, a reload or a crash loses nothing that was not saved.

use serde::{Deserialize, Serialize};
use sluice_engine::graph::GraphDoc;

const DRAFT_KEY: &str = "sluice.draft";

/// What is kept between visits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Draft {
    /// The document being edited (editor form: unconnected ports kept).
    pub doc: GraphDoc,
    /// The document as last saved or opened, if it was.
    pub saved: Option<GraphDoc>,
    /// Whether the document had weights of its own (an imported model's), which the
    /// draft does not keep: restored, it runs with seeded weights and says so.
    #[serde(default)]
    pub weights_not_kept: bool,
}

fn storage() -> Option<web_sys::Storage> {
    web_sys::window()?.local_storage().ok().flatten()
}

/// Keeps the draft; false when the browser refuses (storage full or disabled).
pub fn save_draft(draft: &Draft) -> bool {
    let Ok(text) = serde_json::to_string(draft) else {
        return false;
    };
    storage().is_some_and(|s| s.set_item(DRAFT_KEY, &text).is_ok())
}

/// The draft of the last visit, if one was kept and still reads.
pub fn load_draft() -> Option<Draft> {
    let text = storage()?.get_item(DRAFT_KEY).ok().flatten()?;
    serde_json::from_str(&text).ok()
}
