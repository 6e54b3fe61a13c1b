//! The worker protocol from both ends: a control message as either side decodes it (a
//! `load`'s plan as the worker reads and checks it), and a tensor frame against a header, as the
//! server decodes a worker's outputs and the worker a server's tensors.
//!
//! Input layout: a JSON text, then the byte 0xFF, then a frame. Without 0xFF the whole
//! input is the JSON text and the frame is empty.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_api::protocol::{check_plan, decode, TensorHeader, ToServer, ToWorker};

fuzz_target!(|data: &[u8]| {
    let (json, frame) = match data.iter().position(|&b| b == 0xFF) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    if let Ok(ToWorker::Load { plan, .. }) = serde_json::from_slice::<ToWorker>(json) {
        // The worker's check of a plan it is asked to load, on whatever a server sends.
        if let Ok(plan) = serde_json::from_value::<sluice_engine::plan::Plan>(plan) {
            let limits = sluice_engine::limits::Limits::default();
            let _ = check_plan(&plan, &limits, u64::MAX);
        }
    }
    match serde_json::from_slice::<ToServer>(json) {
        Ok(ToServer::Result { outputs, .. }) => {
            for h in &outputs {
                let _ = decode(h, frame);
            }
        }
        Ok(_) | Err(_) => {}
    }
    if let Ok(h) = serde_json::from_slice::<TensorHeader>(json) {
        if let Ok(t) = decode(&h, frame) {
            assert_eq!(t.shape, h.shape);
        }
    }
});
