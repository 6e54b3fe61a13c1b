// Conv/pool family: direct 2-D convolution (stride, padding, dilation, groups, bias) and
// max / average pooling, one invocation per output element. NCHW layout.

//! variant conv2d
// info = [N, C, H, W, OC, OH, OW, KH, KW, stride h, stride w, pad top, pad left,
//         dilation h, dilation w, groups]
@group(0) @binding(0) var<storage, read> info: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
{{BIAS_DECL}}

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * {{WG}}u;
    let c = info[1];
    let h = i32(info[2]);
    let w = i32(info[3]);
    let oc_n = info[4];
    let oh_n = info[5];
    let ow_n = info[6];
    let kh_n = info[7];
    let kw_n = info[8];
    if (idx >= info[0] * oc_n * oh_n * ow_n) {
        return;
    }
    let ow = idx % ow_n;
    let oh = (idx / ow_n) % oh_n;
    let oc = (idx / (ow_n * oh_n)) % oc_n;
    let n = idx / (ow_n * oh_n * oc_n);
    let groups = info[15];
    let cg = c / groups;
    let g = oc / (oc_n / groups);
    let ih0 = i32(oh * info[9]) - i32(info[11]);
    let iw0 = i32(ow * info[10]) - i32(info[12]);
    var acc = 0.0;
    for (var ci = 0u; ci < cg; ci = ci + 1u) {
        let plane = (n * c + g * cg + ci) * u32(h * w);
        let wbase = (oc * cg + ci) * kh_n * kw_n;
        for (var kh = 0u; kh < kh_n; kh = kh + 1u) {
            let ih = ih0 + i32(kh * info[13]);
            if (ih < 0 || ih >= h) {
                continue;
            }
            for (var kw = 0u; kw < kw_n; kw = kw + 1u) {
                let iw = iw0 + i32(kw * info[14]);
                if (iw < 0 || iw >= w) {
                    continue;
                }
                acc = fma(src[plane + u32(ih * w + iw)], weight[wbase + kh * kw_n + kw], acc);
            }
        }
    }
    dst[idx] = {{OUT}};
}

//! variant pool
// info = [N×C, H, W, OH, OW, KH, KW, stride h, stride w, pad top, pad left, dilation h,
//         dilation w, count_include_pad, pad bottom, pad right]
@group(0) @binding(0) var<storage, read> info: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * {{WG}}u;
    let h = i32(info[1]);
    let w = i32(info[2]);
    let oh_n = info[3];
    let ow_n = info[4];
    if (idx >= info[0] * oh_n * ow_n) {
        return;
    }
    let ow = idx % ow_n;
    let oh = (idx / ow_n) % oh_n;
    let plane = (idx / (ow_n * oh_n)) * u32(h * w);
    let ih0 = i32(oh * info[7]) - i32(info[9]);
    let iw0 = i32(ow * info[8]) - i32(info[10]);
    let pb = i32(info[14]);
    let pr = i32(info[15]);
    var best = -3.4028234e38;
    var sum = 0.0;
    var valid = 0u;
    var padded = 0u;
    for (var kh = 0u; kh < info[5]; kh = kh + 1u) {
        let ih = ih0 + i32(kh * info[11]);
        for (var kw = 0u; kw < info[6]; kw = kw + 1u) {
            let iw = iw0 + i32(kw * info[12]);
            if (ih >= -i32(info[9]) && ih < h + pb && iw >= -i32(info[10]) && iw < w + pr) {
                padded = padded + 1u;
            }
            if (ih >= 0 && ih < h && iw >= 0 && iw < w) {
                let v = src[plane + u32(ih * w + iw)];
                best = max(best, v);
                sum = sum + v;
                valid = valid + 1u;
            }
        }
    }
    let count = f32(max(select(valid, padded, info[13] == 1u), 1u));
    dst[idx] = {{OUT}};
}
