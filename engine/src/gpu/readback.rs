//! Awaiting the GPU. On native targets (feature `native`) the device is polled until the
//! awaited submission completes; in browsers the event loop drives it and this only awaits.

use crate::error::RunError;
use futures_channel::oneshot;

/// A pending buffer map.
pub type MapPending = oneshot::Receiver<Result<(), wgpu::BufferAsyncError>>;

/// Starts mapping a whole buffer for reading.
pub fn start_map(buffer: &wgpu::Buffer) -> MapPending {
    let (tx, rx) = oneshot::channel();
    buffer.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    rx
}

/// Waits for a map started with [`start_map`]; `submission` is the submission that writes
/// the buffer (native polling waits for just that one).
pub async fn finish_map(
    device: &wgpu::Device,
    pending: MapPending,
    submission: Option<wgpu::SubmissionIndex>,
) -> Result<(), RunError> {
    #[cfg(all(feature = "native", not(target_arch = "wasm32")))]
    device
        .poll(wgpu::PollType::Wait {
            submission_index: submission,
            timeout: None,
        })
        .map_err(|e| RunError::Device(format!("waiting for the GPU failed: {e}")))?;
    #[cfg(not(all(feature = "native", not(target_arch = "wasm32"))))]
    let _ = (device, submission);
    match pending.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(RunError::Device(format!(
            "mapping a readback buffer failed: {e}"
        ))),
        Err(_) => Err(RunError::Device(
            "a readback was dropped before it completed".into(),
        )),
    }
}

/// Maps `buffer` for reading and waits until it is mapped.
pub async fn map_read(device: &wgpu::Device, buffer: &wgpu::Buffer) -> Result<(), RunError> {
    let pending = start_map(buffer);
    finish_map(device, pending, None).await
}

/// Waits until all work submitted to `queue` so far has finished.
pub async fn wait_idle(device: &wgpu::Device, queue: &wgpu::Queue) -> Result<(), RunError> {
    let (tx, rx) = oneshot::channel();
    queue.on_submitted_work_done(move || {
        let _ = tx.send(());
    });
    #[cfg(all(feature = "native", not(target_arch = "wasm32")))]
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| RunError::Device(format!("waiting for the GPU failed: {e}")))?;
    #[cfg(not(all(feature = "native", not(target_arch = "wasm32"))))]
    let _ = device;
    rx.await
        .map_err(|_| RunError::Device("the device was lost before the work finished".into()))
}
