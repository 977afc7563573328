//! Drawing the mesh on the page's canvas with WebGPU: shaded triangles, turning slowly.
//!
//! The renderer has a device of its own, apart from the solver's backend: the page draws
//! from the positions each iteration reports, so the solver and the picture share nothing
//! but those numbers (and the solver runs unchanged on the CPU fallback).

use web_sys::HtmlCanvasElement;
use wgpu::util::DeviceExt;

const SHADER: &str = r#"
struct Frame {
    clip_from_model: mat4x4<f32>,
    model: mat4x4<f32>,
    light: vec4<f32>,
};
@group(0) @binding(0) var<uniform> frame: Frame;

struct Out {
    @builtin(position) position: vec4<f32>,
    @location(0) normal: vec3<f32>,
};

@vertex
fn vs(@location(0) position: vec3<f32>, @location(1) normal: vec3<f32>) -> Out {
    var out: Out;
    out.position = frame.clip_from_model * vec4<f32>(position, 1.0);
    out.normal = (frame.model * vec4<f32>(normal, 0.0)).xyz;
    return out;
}

@fragment
fn fs(v: Out) -> @location(0) vec4<f32> {
    let n = normalize(v.normal);
    let diffuse = max(dot(n, frame.light.xyz), 0.0);
    let colour = vec3<f32>(0.32, 0.58, 0.95) * (0.22 + 0.78 * diffuse);
    return vec4<f32>(colour, 1.0);
}
"#;

/// Bytes of the uniform block: two 4x4 matrices and a vector.
const FRAME_BYTES: u64 = (16 + 16 + 4) * 4;

pub struct Renderer {
    device: wgpu::Device,
    queue: wgpu::Queue,
    surface: wgpu::Surface<'static>,
    config: wgpu::SurfaceConfiguration,
    pipeline: wgpu::RenderPipeline,
    frame: wgpu::Buffer,
    bind_group: wgpu::BindGroup,
    depth: wgpu::TextureView,
    vertices: Option<wgpu::Buffer>,
    indices: Option<(wgpu::Buffer, u32)>,
    faces: Vec<[u32; 3]>,
    /// What the adapter says it is, for the page.
    pub adapter: String,
}

impl Renderer {
    pub async fn new(canvas: HtmlCanvasElement) -> Result<Self, String> {
        let (width, height) = (canvas.width().max(1), canvas.height().max(1));
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::BROWSER_WEBGPU,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let surface = instance
            .create_surface(wgpu::SurfaceTarget::Canvas(canvas))
            .map_err(|e| format!("no WebGPU canvas context: {e}"))?;
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                compatible_surface: Some(&surface),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("no WebGPU adapter to draw with: {e}"))?;
        let info = adapter.get_info();
        let adapter_name = if info.name.is_empty() {
            format!("{:?} adapter", info.device_type)
        } else {
            info.name.clone()
        };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor::default())
            .await
            .map_err(|e| format!("the adapter refused a device to draw with: {e}"))?;
        let caps = surface.get_capabilities(&adapter);
        let format = caps
            .formats
            .iter()
            .copied()
            .find(|f| !f.is_srgb())
            .or_else(|| caps.formats.first().copied())
            .ok_or("the canvas offers no texture format")?;
        let config = wgpu::SurfaceConfiguration {
            usage: wgpu::TextureUsages::RENDER_ATTACHMENT,
            format,
            width,
            height,
            present_mode: wgpu::PresentMode::Fifo,
            desired_maximum_frame_latency: 2,
            alpha_mode: caps
                .alpha_modes
                .first()
                .copied()
                .unwrap_or(wgpu::CompositeAlphaMode::Auto),
            view_formats: vec![],
            color_space: Default::default(),
        };
        surface.configure(&device, &config);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("mesh"),
            source: wgpu::ShaderSource::Wgsl(SHADER.into()),
        });
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("frame"),
            entries: &[wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::VERTEX_FRAGMENT,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Uniform,
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            }],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("mesh"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let attributes = wgpu::vertex_attr_array![0 => Float32x3, 1 => Float32x3];
        let pipeline = device.create_render_pipeline(&wgpu::RenderPipelineDescriptor {
            label: Some("mesh"),
            layout: Some(&pipeline_layout),
            vertex: wgpu::VertexState {
                module: &module,
                entry_point: Some("vs"),
                compilation_options: Default::default(),
                buffers: &[Some(wgpu::VertexBufferLayout {
                    array_stride: 24,
                    step_mode: wgpu::VertexStepMode::Vertex,
                    attributes: &attributes,
                })],
            },
            primitive: wgpu::PrimitiveState {
                cull_mode: Some(wgpu::Face::Back),
                ..Default::default()
            },
            depth_stencil: Some(wgpu::DepthStencilState {
                format: wgpu::TextureFormat::Depth32Float,
                depth_write_enabled: Some(true),
                depth_compare: Some(wgpu::CompareFunction::Less),
                stencil: Default::default(),
                bias: Default::default(),
            }),
            multisample: Default::default(),
            fragment: Some(wgpu::FragmentState {
                module: &module,
                entry_point: Some("fs"),
                compilation_options: Default::default(),
                targets: &[Some(format.into())],
            }),
            multiview_mask: None,
            cache: None,
        });
        let frame = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("frame"),
            size: FRAME_BYTES,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("frame"),
            layout: &layout,
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: frame.as_entire_binding(),
            }],
        });
        let depth = depth_view(&device, width, height);
        Ok(Self {
            device,
            queue,
            surface,
            config,
            pipeline,
            frame,
            bind_group,
            depth,
            vertices: None,
            indices: None,
            faces: Vec::new(),
            adapter: adapter_name,
        })
    }

    /// The triangles to draw from now on (counter-clockwise seen from outside).
    pub fn set_faces(&mut self, faces: &[[u32; 3]]) {
        self.faces = faces.to_vec();
        let flat: Vec<u32> = faces.iter().flatten().copied().collect();
        let buffer = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("faces"),
                contents: bytemuck::cast_slice(&flat),
                usage: wgpu::BufferUsages::INDEX,
            });
        self.indices = Some((buffer, flat.len() as u32));
        self.vertices = None;
    }

    /// Draws the mesh at `positions` (x, y, z per vertex) turned by `angle` radians about the
    /// vertical axis.
    pub fn draw(&mut self, positions: &[f64], angle: f32) -> Result<(), String> {
        let Some((indices, index_count)) = &self.indices else {
            return Err("draw before set_faces".into());
        };
        let vertices = shaded_vertices(positions, &self.faces);
        let bytes: &[u8] = bytemuck::cast_slice(&vertices);
        match &self.vertices {
            Some(b) if b.size() == bytes.len() as u64 => self.queue.write_buffer(b, 0, bytes),
            _ => {
                self.vertices = Some(self.device.create_buffer_init(
                    &wgpu::util::BufferInitDescriptor {
                        label: Some("vertices"),
                        contents: bytes,
                        usage: wgpu::BufferUsages::VERTEX | wgpu::BufferUsages::COPY_DST,
                    },
                ));
            }
        }
        let aspect = self.config.width as f32 / self.config.height as f32;
        let model = rotation_y(angle);
        let clip = mul(&perspective(0.8, aspect, 0.1, 10.0), &mul(&view(), &model));
        let mut frame = Vec::with_capacity(36);
        frame.extend_from_slice(&clip);
        frame.extend_from_slice(&model);
        let light = normalize([0.4, 0.7, 0.6]);
        frame.extend_from_slice(&[light[0], light[1], light[2], 0.0]);
        self.queue
            .write_buffer(&self.frame, 0, bytemuck::cast_slice(&frame));
        let texture = match self.surface.get_current_texture() {
            wgpu::CurrentSurfaceTexture::Success(t)
            | wgpu::CurrentSurfaceTexture::Suboptimal(t) => t,
            other => return Err(format!("no canvas texture to draw on: {other:?}")),
        };
        let target = texture.texture.create_view(&Default::default());
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_render_pass(&wgpu::RenderPassDescriptor {
                label: Some("mesh"),
                color_attachments: &[Some(wgpu::RenderPassColorAttachment {
                    view: &target,
                    depth_slice: None,
                    resolve_target: None,
                    ops: wgpu::Operations {
                        load: wgpu::LoadOp::Clear(wgpu::Color {
                            r: 0.06,
                            g: 0.07,
                            b: 0.09,
                            a: 1.0,
                        }),
                        store: wgpu::StoreOp::Store,
                    },
                })],
                depth_stencil_attachment: Some(wgpu::RenderPassDepthStencilAttachment {
                    view: &self.depth,
                    depth_ops: Some(wgpu::Operations {
                        load: wgpu::LoadOp::Clear(1.0),
                        store: wgpu::StoreOp::Discard,
                    }),
                    stencil_ops: None,
                }),
                timestamp_writes: None,
                occlusion_query_set: None,
                multiview_mask: None,
            });
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &self.bind_group, &[]);
            pass.set_vertex_buffer(0, self.vertices.as_ref().expect("made above").slice(..));
            pass.set_index_buffer(indices.slice(..), wgpu::IndexFormat::Uint32);
            pass.draw_indexed(0..*index_count, 0, 0..1);
        }
        self.queue.submit([encoder.finish()]);
        self.queue.present(texture);
        Ok(())
    }
}

fn depth_view(device: &wgpu::Device, width: u32, height: u32) -> wgpu::TextureView {
    device
        .create_texture(&wgpu::TextureDescriptor {
            label: Some("depth"),
            size: wgpu::Extent3d {
                width,
                height,
                depth_or_array_layers: 1,
            },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Depth32Float,
            usage: wgpu::TextureUsages::RENDER_ATTACHMENT,
            view_formats: &[],
        })
        .create_view(&Default::default())
}

/// Position and area-weighted vertex normal per vertex, as f32.
fn shaded_vertices(positions: &[f64], faces: &[[u32; 3]]) -> Vec<[f32; 6]> {
    let p = |v: u32| {
        let i = v as usize * 3;
        [positions[i], positions[i + 1], positions[i + 2]]
    };
    let mut normals = vec![[0.0f64; 3]; positions.len() / 3];
    for &[a, b, c] in faces {
        let (pa, pb, pc) = (p(a), p(b), p(c));
        let (u, w) = (sub(pb, pa), sub(pc, pa));
        let n = [
            u[1] * w[2] - u[2] * w[1],
            u[2] * w[0] - u[0] * w[2],
            u[0] * w[1] - u[1] * w[0],
        ];
        for v in [a, b, c] {
            let acc = &mut normals[v as usize];
            for k in 0..3 {
                acc[k] += n[k];
            }
        }
    }
    normals
        .iter()
        .enumerate()
        .map(|(v, n)| {
            let x = p(v as u32);
            let n = normalize(n.map(|c| c as f32));
            [x[0] as f32, x[1] as f32, x[2] as f32, n[0], n[1], n[2]]
        })
        .collect()
}

fn sub(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2]]
}

fn normalize(v: [f32; 3]) -> [f32; 3] {
    let n = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
    if n > 0.0 { v.map(|c| c / n) } else { v }
}

/// Column-major 4x4 matrices, as WGSL reads them.
type Mat4 = [f32; 16];

fn mul(a: &Mat4, b: &Mat4) -> Mat4 {
    let mut out = [0.0; 16];
    for col in 0..4 {
        for row in 0..4 {
            out[col * 4 + row] = (0..4).map(|k| a[k * 4 + row] * b[col * 4 + k]).sum();
        }
    }
    out
}

fn rotation_y(angle: f32) -> Mat4 {
    let (s, c) = angle.sin_cos();
    [
        c, 0.0, -s, 0.0, //
        0.0, 1.0, 0.0, 0.0, //
        s, 0.0, c, 0.0, //
        0.0, 0.0, 0.0, 1.0,
    ]
}

/// The camera: 3.2 units back along +z, tilted down a little.
fn view() -> Mat4 {
    let (s, c) = 0.35f32.sin_cos();
    let tilt = [
        1.0, 0.0, 0.0, 0.0, //
        0.0, c, s, 0.0, //
        0.0, -s, c, 0.0, //
        0.0, 0.0, 0.0, 1.0,
    ];
    let back = [
        1.0, 0.0, 0.0, 0.0, //
        0.0, 1.0, 0.0, 0.0, //
        0.0, 0.0, 1.0, 0.0, //
        0.0, 0.0, -3.2, 1.0,
    ];
    mul(&back, &tilt)
}

/// WebGPU's clip space: depth 0 to 1.
fn perspective(fov_y: f32, aspect: f32, near: f32, far: f32) -> Mat4 {
    let f = 1.0 / (fov_y / 2.0).tan();
    let r = far / (near - far);
    [
        f / aspect,
        0.0,
        0.0,
        0.0, //
        0.0,
        f,
        0.0,
        0.0, //
        0.0,
        0.0,
        r,
        -1.0, //
        0.0,
        0.0,
        r * near,
        0.0,
    ]
}
