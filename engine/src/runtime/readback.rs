//! Awaiting buffer maps. On native targets (feature `native`) the device is polled until
//! the map completes; in browsers the event loop drives it and this only awaits.

use super::RunError;

/// Maps `buffer` for reading and waits until it is mapped.
pub async fn map_read(device: &wgpu::Device, buffer: &wgpu::Buffer) -> Result<(), RunError> {
    let (tx, rx) = futures_channel::oneshot::channel();
    buffer.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    #[cfg(all(feature = "native", not(target_arch = "wasm32")))]
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| RunError::Device(format!("waiting for the GPU failed: {e}")))?;
    #[cfg(not(all(feature = "native", not(target_arch = "wasm32"))))]
    let _ = device;
    match rx.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(RunError::Device(format!(
            "mapping the readback buffer failed: {e}"
        ))),
        Err(_) => Err(RunError::Device(
            "the readback was dropped before it completed".into(),
        )),
    }
}

/// Waits until all work submitted to `queue` so far has finished.
pub async fn wait_idle(device: &wgpu::Device, queue: &wgpu::Queue) -> Result<(), RunError> {
    let (tx, rx) = futures_channel::oneshot::channel();
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
