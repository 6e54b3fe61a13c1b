//! The rgba32float textures some kernels stage operands in (see [`super::kernel::Slot::Texture`]):
//! one pass writes a texture as storage, later ones read it with `textureLoad`. On
//! software rasterisers a texture fetch gathers a whole vec4 per invocation, where a
//! storage-buffer load reads element by element.

/// Bytes of one texel (four f32).
const TEXEL_BYTES: u64 = 16;

/// Creates a texture of `size` texels (width, height) that passes can write and read.
pub fn create(device: &wgpu::Device, label: &str, size: [u32; 2]) -> wgpu::Texture {
    device.create_texture(&wgpu::TextureDescriptor {
        label: Some(label),
        size: wgpu::Extent3d {
            width: size[0].max(1),
            height: size[1].max(1),
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba32Float,
        usage: wgpu::TextureUsages::STORAGE_BINDING | wgpu::TextureUsages::TEXTURE_BINDING,
        view_formats: &[],
    })
}

/// Bytes a texture of `size` texels holds.
pub fn bytes(size: [u32; 2]) -> u64 {
    u64::from(size[0]) * u64::from(size[1]) * TEXEL_BYTES
}
