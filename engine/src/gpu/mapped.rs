//! Buffers the host writes through a mapping, kept mapped between the micro-batches that
//! read them: unmapped just before a submission, mapped again once it has run. Two uses:
//!
//! - a prefetch slot's upload buffer, whose contents the micro-batch's commands copy into
//!   the inputs' device buffers. `Queue::write_buffer` would instead make a new staging
//!   buffer for every write, whose fresh memory the OS faults in page by page.
//! - on a CPU adapter (lavapipe), the inputs' device buffers themselves: device memory is
//!   host memory there, so the host writes each input once, where the passes read it,
//!   instead of into a staging buffer that the device then copies (three copies of every
//!   input, counting the micro-batch's cut, become two, on the cores the passes run on).

use super::readback::MapPending;
use crate::error::RunError;
use futures_channel::oneshot;

/// How long [`MappedBuffer::wait_mapped`] waits for the device.
#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
const MAP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Where the buffer's mapping stands.
enum State {
    /// Mapped for writing: the host may write it.
    Mapped,
    /// A map started after the submission that reads it, not yet seen to finish.
    Mapping(MapPending),
    /// Unmapped and not being mapped (its last map failed).
    Unmapped,
}

/// A buffer written through a mapping, and where its mapping stands.
pub struct MappedBuffer {
    buffer: wgpu::Buffer,
    state: State,
}

impl MappedBuffer {
    /// A buffer of `bytes` (rounded up to a whole number of words) with `usage` and
    /// `MAP_WRITE`, mapped for writing. Usages other than `COPY_SRC` need the device
    /// feature `MAPPABLE_PRIMARY_BUFFERS`.
    pub fn new(
        device: &wgpu::Device,
        label: &str,
        bytes: u64,
        usage: wgpu::BufferUsages,
    ) -> MappedBuffer {
        let size = bytes.max(4).div_ceil(wgpu::COPY_BUFFER_ALIGNMENT) * wgpu::COPY_BUFFER_ALIGNMENT;
        MappedBuffer {
            buffer: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: usage | wgpu::BufferUsages::MAP_WRITE,
                mapped_at_creation: true,
            }),
            state: State::Mapped,
        }
    }

    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.buffer.size()
    }

    /// The buffer.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Whether the host may write it now (a re-map that has finished is taken up here).
    pub fn ready(&mut self) -> bool {
        if let State::Mapping(pending) = &mut self.state {
            self.state = match pending.try_recv() {
                Ok(None) => return false,
                Ok(Some(Ok(()))) => State::Mapped,
                Ok(Some(Err(_))) | Err(oneshot::Canceled) => State::Unmapped,
            };
        }
        matches!(self.state, State::Mapped)
    }

    /// Writes `bytes` at `offset`; the range must lie inside the buffer and the buffer be
    /// [`Staging::ready`].
    pub fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<(), RunError> {
        let end = offset
            .checked_add(bytes.len() as u64)
            .filter(|&end| end <= self.size() && !bytes.is_empty())
            .ok_or_else(|| {
                RunError::Internal(format!(
                    "{} bytes at offset {offset} do not fit the {}-byte upload buffer",
                    bytes.len(),
                    self.size()
                ))
            })?;
        let mut view = self
            .buffer
            .get_mapped_range_mut(offset..end)
            .map_err(|e| RunError::Device(format!("writing the upload buffer failed: {e:?}")))?;
        view.copy_from_slice(bytes);
        Ok(())
    }

    /// Unmaps it if it is mapped, so that the commands about to be submitted may use it.
    pub fn unmap(&mut self) {
        if matches!(self.state, State::Mapped) {
            self.buffer.unmap();
            self.state = State::Unmapped;
        }
    }

    /// Whether a map is under way (the buffer may not be used by a submission then).
    pub fn mapping(&self) -> bool {
        matches!(self.state, State::Mapping(_))
    }

    /// Waits until it is mapped, starting a map if none is under way: for buffers whose
    /// last reader may still be running. Native only (browsers never map device buffers
    /// in place, and their upload buffers are awaited by [`MappedBuffer::settle`]).
    pub fn wait_mapped(&mut self, device: &wgpu::Device, what: &str) -> Result<(), RunError> {
        if self.ready() {
            return Ok(());
        }
        self.remap();
        #[cfg(all(feature = "native", not(target_arch = "wasm32")))]
        device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: Some(MAP_TIMEOUT),
            })
            .map_err(|e| RunError::Device(format!("waiting for the GPU failed: {e}")))?;
        #[cfg(not(all(feature = "native", not(target_arch = "wasm32"))))]
        let _ = device;
        if self.ready() {
            Ok(())
        } else {
            Err(RunError::Device(format!(
                "{what}: its device buffer could not be mapped for writing"
            )))
        }
    }

    /// Starts mapping it again; the map finishes once the submitted commands have read it.
    pub fn remap(&mut self) {
        if !matches!(self.state, State::Unmapped) {
            return;
        }
        let (tx, rx) = oneshot::channel();
        self.buffer
            .slice(..)
            .map_async(wgpu::MapMode::Write, move |r| {
                let _ = tx.send(r);
            });
        self.state = State::Mapping(rx);
    }

    /// Takes up the re-map started by [`Staging::remap`] once the submission that reads
    /// the buffer is known to have finished. Native: after polling for that submission,
    /// whose map callbacks have run by then, so nothing is awaited. Browsers: the page's
    /// event loop resolves the map, which is awaited (a lost device rejects it).
    pub async fn settle(&mut self) {
        #[cfg(all(feature = "native", not(target_arch = "wasm32")))]
        self.ready();
        #[cfg(not(all(feature = "native", not(target_arch = "wasm32"))))]
        if let State::Mapping(pending) = std::mem::replace(&mut self.state, State::Unmapped) {
            if let Ok(Ok(())) = pending.await {
                self.state = State::Mapped;
            }
        }
    }
}
