//! `.npy` bytes (an uploaded input, a `--input` file): parsed, and what parses written back
//! and parsed again to the same tensor.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(t) = sluice_engine::npy::parse(data) else {
        return;
    };
    let bytes = sluice_engine::npy::to_bytes(&t).expect("a parsed tensor writes back");
    let again = sluice_engine::npy::parse(&bytes).expect("a written tensor parses");
    assert_eq!(again.shape, t.shape);
    assert_eq!(again.dtype(), t.dtype());
});
