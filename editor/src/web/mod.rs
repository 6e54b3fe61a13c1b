//! The page's side of the browser: HTTP and WebSocket calls to `sluice serve`
//! ([`api`]), local storage of drafts ([`storage`]), file downloads and uploads
//! ([`files`]), and the two ways a run goes: on the server ([`server_run`]) or in this
//! page on WebGPU ([`browser_run`]).

pub mod api;
pub mod browser_run;
pub mod files;
pub mod server_run;
pub mod storage;
