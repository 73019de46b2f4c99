//! The NVIDIA nvJPEG backend (feature `nvjpeg`): JPEG decoding on the GPU with nvJPEG's single-image API
//! (`nvjpegDecode`, default backend: Huffman decoding on the CPU, IDCT and colour conversion on the GPU) into a
//! device buffer, then a copy to the caller's host [`ImageRgb8`].
//!
//! What it does:
//! - Builds without the CUDA toolkit or a GPU. `libnvjpeg.so.13` (fallback `libnvjpeg.so`) and the CUDA runtime
//!   `libcudart.so.13` (fallback `libcudart.so`) are opened at run time with `libloading`, through the ordinary
//!   dynamic loader search path: with the `nvidia-nvjpeg` 13.0 wheel (and `nvidia-cuda-runtime` 13.0 for
//!   libcudart) installed, put its `nvidia/cu13/lib` directory on `LD_LIBRARY_PATH`. The libraries are loaded once
//!   per process.
//! - [`NvJpegDecoder::new`] fails with [`DecodeError::Unavailable`] (naming the library it tried and the dlopen
//!   or CUDA error) when a library is missing, no CUDA device is visible, or nvJPEG cannot create its handle; it
//!   never panics. [`crate::Backend::preferred`] skips the backend then, so a CPU-only machine built with this
//!   feature still decodes with the CPU backends.
//! - The decoded pixels go to a device buffer that grows to the largest image seen and is never reallocated while
//!   images fit. Grayscale JPEGs decode as luma (`NVJPEG_OUTPUT_Y`) and are expanded to RGB on the host; colour
//!   JPEGs decode as interleaved RGB (`NVJPEG_OUTPUT_RGBI`). EXIF orientation is applied on the host while
//!   copying, as the other backends do.
//! - JPEGs nvJPEG does not decode (4-component CMYK/YCCK, and whatever it answers
//!   `NVJPEG_STATUS_JPEG_NOT_SUPPORTED` or `NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED` for, e.g. lossless JPEG)
//!   are decoded on the CPU by the `turbojpeg` backend when compiled in, else by `image`, at full size; errors of
//!   that path name the backend `nvjpeg (CPU fallback: ...)`. Non-JPEG input (PNG, BMP, WebP) goes to the `image`
//!   backend when that is compiled in and is refused otherwise.
//!
//! What it does not do:
//! - No DCT-domain scaling: nvJPEG has none, so the hint's reduced scale is ignored and every decode is full size
//!   (`scale` 1); [`crate::decode_to_target`] then does the whole reduction in its resize step.
//! - Single-image decodes only, each followed by a synchronous device-to-host copy (to pageable memory): no batched
//!   decode, no pinned staging, and the pixels do not stay on the GPU.
//! - Thread safety: an nvJPEG handle and its decode state must not be used by two threads at once. A decoder keeps
//!   its GPU contexts (handle, state, stream, device buffer, host staging buffer) in a pool behind a [`Mutex`]:
//!   each decode takes one out for its duration (creating one when all are in use) and puts it back, so a decoder
//!   shared by several threads (`Send + Sync`, as [`Decoder`] requires) decodes on as many contexts as threads
//!   decode at once. The pool never shrinks; each context holds its own device buffer.
//! - After a GPU fault (a sticky CUDA error) the context is unusable and later decodes fail with
//!   [`DecodeError::Device`]; nothing recreates it.
//! - It uses the current CUDA device of the calling thread (device 0 unless the process chose another).
//! - It needs a CUDA GPU and driver at run time. The crate's tests on a CPU-only machine cover only the
//!   "unavailable" path; run the conformance suite with `SLUICE_REQUIRE_NVJPEG=1` on a GPU machine to cover the
//!   decode path (the suite then fails instead of skipping nvjpeg when it cannot be constructed).

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use libloading::Library;
use sluice_core::{DecodeHint, DecodeInfo, Decoder, ImageRgb8};

use crate::DEFAULT_MAX_PIXELS;
use crate::error::{DecodeError, Result};
use crate::format::jpeg_orientation;
use crate::orient::{Orientation, convert_into};

const NAME: &str = "nvjpeg";

/// The backend name in errors of the CPU path for JPEGs nvJPEG does not decode.
#[cfg(feature = "turbojpeg")]
const FALLBACK_NAME: &str = "nvjpeg (CPU fallback: turbojpeg)";
#[cfg(all(not(feature = "turbojpeg"), feature = "image"))]
const FALLBACK_NAME: &str = "nvjpeg (CPU fallback: image)";

/// The libraries tried, in order.
const NVJPEG_LIBS: [&str; 2] = ["libnvjpeg.so.13", "libnvjpeg.so"];
const CUDART_LIBS: [&str; 2] = ["libcudart.so.13", "libcudart.so"];

const WHERE: &str = "install the `nvidia-nvjpeg` 13.0 wheel (and `nvidia-cuda-runtime` 13.0) and put its \
                     `nvidia/cu13/lib` directory on LD_LIBRARY_PATH";

// --- FFI declarations, checked against CUDA 13.0's nvjpeg.h, cuda_runtime_api.h and driver_types.h. ---

type NvjpegHandle = *mut c_void; // nvjpegHandle_t: struct nvjpegHandle*
type NvjpegState = *mut c_void; // nvjpegJpegState_t: struct nvjpegJpegState*
type CudaStream = *mut c_void; // cudaStream_t: struct CUstream_st*
type NvjpegStatus = c_int; // nvjpegStatus_t (enum)
type CudaError = c_int; // cudaError_t (enum cudaError)

/// `NVJPEG_MAX_COMPONENT`.
const NVJPEG_MAX_COMPONENT: usize = 4;
const NVJPEG_STATUS_SUCCESS: NvjpegStatus = 0;
const NVJPEG_STATUS_NOT_INITIALIZED: NvjpegStatus = 1;
const NVJPEG_STATUS_JPEG_NOT_SUPPORTED: NvjpegStatus = 4;
const NVJPEG_STATUS_ALLOCATOR_FAILURE: NvjpegStatus = 5;
const NVJPEG_STATUS_ARCH_MISMATCH: NvjpegStatus = 7;
const NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: NvjpegStatus = 9;
/// `nvjpegChromaSubsampling_t::NVJPEG_CSS_GRAY`.
const NVJPEG_CSS_GRAY: c_int = 6;
/// `nvjpegOutputFormat_t::NVJPEG_OUTPUT_Y`: luma only, into `channel[0]`.
const NVJPEG_OUTPUT_Y: c_int = 2;
/// `nvjpegOutputFormat_t::NVJPEG_OUTPUT_RGBI`: interleaved RGB, into `channel[0]`.
const NVJPEG_OUTPUT_RGBI: c_int = 5;
const CUDA_SUCCESS: CudaError = 0;
/// `cudaStreamNonBlocking`.
const CUDA_STREAM_NON_BLOCKING: c_uint = 0x01;
/// `cudaMemcpyKind::cudaMemcpyDeviceToHost`.
const CUDA_MEMCPY_DEVICE_TO_HOST: c_int = 2;

/// `nvjpegImage_t`: `{ unsigned char* channel[NVJPEG_MAX_COMPONENT]; size_t pitch[NVJPEG_MAX_COMPONENT]; }`.
#[repr(C)]
struct NvjpegImage {
    channel: [*mut u8; NVJPEG_MAX_COMPONENT],
    pitch: [usize; NVJPEG_MAX_COMPONENT],
}

/// The entry points, resolved from the two libraries (which the struct keeps loaded).
struct Api {
    nvjpeg_create_simple: unsafe extern "C" fn(*mut NvjpegHandle) -> NvjpegStatus,
    nvjpeg_destroy: unsafe extern "C" fn(NvjpegHandle) -> NvjpegStatus,
    nvjpeg_jpeg_state_create: unsafe extern "C" fn(NvjpegHandle, *mut NvjpegState) -> NvjpegStatus,
    nvjpeg_jpeg_state_destroy: unsafe extern "C" fn(NvjpegState) -> NvjpegStatus,
    /// `(handle, data, length, *nComponents, *subsampling, widths[4], heights[4])`.
    nvjpeg_get_image_info: unsafe extern "C" fn(
        NvjpegHandle,
        *const u8,
        usize,
        *mut c_int,
        *mut c_int,
        *mut c_int,
        *mut c_int,
    ) -> NvjpegStatus,
    /// `(handle, state, data, length, output_format, *destination, stream)`.
    nvjpeg_decode: unsafe extern "C" fn(
        NvjpegHandle,
        NvjpegState,
        *const u8,
        usize,
        c_int,
        *mut NvjpegImage,
        CudaStream,
    ) -> NvjpegStatus,
    cuda_get_device_count: unsafe extern "C" fn(*mut c_int) -> CudaError,
    cuda_stream_create_with_flags: unsafe extern "C" fn(*mut CudaStream, c_uint) -> CudaError,
    cuda_stream_synchronize: unsafe extern "C" fn(CudaStream) -> CudaError,
    cuda_stream_destroy: unsafe extern "C" fn(CudaStream) -> CudaError,
    cuda_malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> CudaError,
    cuda_free: unsafe extern "C" fn(*mut c_void) -> CudaError,
    /// `(dst, dpitch, src, spitch, width_bytes, height, kind, stream)`.
    cuda_memcpy_2d_async:
        unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, usize, usize, c_int, CudaStream) -> CudaError,
    cuda_get_error_string: unsafe extern "C" fn(CudaError) -> *const c_char,
    nvjpeg_lib: &'static str,
    cudart_lib: &'static str,
    // Last, so that the function pointers above never outlive them.
    _nvjpeg: Library,
    _cudart: Library,
}

/// Opens the first of `names` that loads, or says why none did.
fn open(names: &[&'static str]) -> std::result::Result<(Library, &'static str), String> {
    let mut errors = Vec::new();
    for &name in names {
        // SAFETY: loading runs the library's initialisers; NVIDIA's nvJPEG and CUDA runtime libraries have no
        // initialisers with preconditions on the caller.
        match unsafe { Library::new(name) } {
            Ok(lib) => return Ok((lib, name)),
            Err(e) => errors.push(e.to_string()),
        }
    }
    Err(format!("could not load {} ({}); {WHERE}", names.join(" nor "), errors.join("; ")))
}

/// Resolves `name` in `lib` as a value of the function-pointer type `T`.
///
/// # Safety
/// `T` must be the symbol's true C signature.
unsafe fn symbol<T: Copy>(lib: &Library, lib_name: &str, name: &str) -> std::result::Result<T, String> {
    // SAFETY: the caller guarantees the signature; the pointer is used only while `lib` is kept loaded (in `Api`).
    unsafe { lib.get::<T>(name.as_bytes()) }.map(|s| *s).map_err(|e| format!("{lib_name}: no symbol `{name}`: {e}"))
}

impl Api {
    fn load() -> std::result::Result<Api, String> {
        let (nvjpeg, nvjpeg_lib) = open(&NVJPEG_LIBS)?;
        let (cudart, cudart_lib) = open(&CUDART_LIBS)?;
        // SAFETY: every field's type is the C prototype of the named function in CUDA 13.0's headers.
        unsafe {
            Ok(Api {
                nvjpeg_create_simple: symbol(&nvjpeg, nvjpeg_lib, "nvjpegCreateSimple")?,
                nvjpeg_destroy: symbol(&nvjpeg, nvjpeg_lib, "nvjpegDestroy")?,
                nvjpeg_jpeg_state_create: symbol(&nvjpeg, nvjpeg_lib, "nvjpegJpegStateCreate")?,
                nvjpeg_jpeg_state_destroy: symbol(&nvjpeg, nvjpeg_lib, "nvjpegJpegStateDestroy")?,
                nvjpeg_get_image_info: symbol(&nvjpeg, nvjpeg_lib, "nvjpegGetImageInfo")?,
                nvjpeg_decode: symbol(&nvjpeg, nvjpeg_lib, "nvjpegDecode")?,
                cuda_get_device_count: symbol(&cudart, cudart_lib, "cudaGetDeviceCount")?,
                cuda_stream_create_with_flags: symbol(&cudart, cudart_lib, "cudaStreamCreateWithFlags")?,
                cuda_stream_synchronize: symbol(&cudart, cudart_lib, "cudaStreamSynchronize")?,
                cuda_stream_destroy: symbol(&cudart, cudart_lib, "cudaStreamDestroy")?,
                cuda_malloc: symbol(&cudart, cudart_lib, "cudaMalloc")?,
                cuda_free: symbol(&cudart, cudart_lib, "cudaFree")?,
                cuda_memcpy_2d_async: symbol(&cudart, cudart_lib, "cudaMemcpy2DAsync")?,
                cuda_get_error_string: symbol(&cudart, cudart_lib, "cudaGetErrorString")?,
                nvjpeg_lib,
                cudart_lib,
                _nvjpeg: nvjpeg,
                _cudart: cudart,
            })
        }
    }

    /// The libraries, loaded once per process (a failure is remembered too).
    fn get() -> std::result::Result<Arc<Api>, String> {
        static API: OnceLock<std::result::Result<Arc<Api>, String>> = OnceLock::new();
        API.get_or_init(|| Api::load().map(Arc::new)).clone()
    }

    /// `"cudaErrorX (message) from call"`.
    fn cuda_error(&self, call: &str, err: CudaError) -> String {
        // SAFETY: cudaGetErrorString accepts any value and returns a static NUL-terminated string (or null).
        let msg = unsafe { (self.cuda_get_error_string)(err) };
        let text = if msg.is_null() {
            "unknown error".to_owned()
        } else {
            // SAFETY: non-null, NUL-terminated, static.
            unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
        };
        format!("{call} failed with CUDA error {err} ({text}) in {}", self.cudart_lib)
    }
}

/// The name of an `nvjpegStatus_t` value.
fn status_name(status: NvjpegStatus) -> String {
    let name = match status {
        0 => "NVJPEG_STATUS_SUCCESS",
        1 => "NVJPEG_STATUS_NOT_INITIALIZED",
        2 => "NVJPEG_STATUS_INVALID_PARAMETER",
        3 => "NVJPEG_STATUS_BAD_JPEG",
        4 => "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
        5 => "NVJPEG_STATUS_ALLOCATOR_FAILURE",
        6 => "NVJPEG_STATUS_EXECUTION_FAILED",
        7 => "NVJPEG_STATUS_ARCH_MISMATCH",
        8 => "NVJPEG_STATUS_INTERNAL_ERROR",
        9 => "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
        10 => "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
        other => return format!("nvjpegStatus {other}"),
    };
    name.to_owned()
}

/// Whether a failed decode status means "this JPEG variant is not for nvJPEG" (decode it on the CPU instead).
fn not_supported(status: NvjpegStatus) -> bool {
    matches!(status, NVJPEG_STATUS_JPEG_NOT_SUPPORTED | NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED)
}

/// Whether a failed decode status is about the GPU or the library rather than the input bytes.
fn device_failure(status: NvjpegStatus) -> bool {
    matches!(status, NVJPEG_STATUS_NOT_INITIALIZED | NVJPEG_STATUS_ALLOCATOR_FAILURE | NVJPEG_STATUS_ARCH_MISMATCH)
}

/// One GPU decode context: nvJPEG handle and state, a stream, the device output buffer and a host staging buffer
/// for the paths that convert or rotate. Used by one thread at a time ([`NvJpegDecoder`] pools them behind a mutex).
struct Gpu {
    api: Arc<Api>,
    handle: NvjpegHandle,
    state: NvjpegState,
    stream: CudaStream,
    /// Device buffer of `capacity` bytes (null while 0).
    buffer: *mut c_void,
    capacity: usize,
    host: Vec<u8>,
}

// SAFETY: nvJPEG handles/states, CUDA streams and device pointers are not tied to the thread that created them;
// they only must not be used by two threads at once: a `Gpu` is owned by the pool (behind a `Mutex`) or by the one
// decode that took it out.
unsafe impl Send for Gpu {}

impl Gpu {
    fn new(api: Arc<Api>) -> std::result::Result<Gpu, String> {
        let mut gpu = Gpu {
            api,
            handle: ptr::null_mut(),
            state: ptr::null_mut(),
            stream: ptr::null_mut(),
            buffer: ptr::null_mut(),
            capacity: 0,
            host: Vec::new(),
        };
        let api = Arc::clone(&gpu.api);
        let mut count: c_int = 0;
        // SAFETY: valid out-pointer. (Each call below gets valid out-pointers; whatever was created before a failure
        // is released by `Drop`.)
        let err = unsafe { (api.cuda_get_device_count)(&mut count) };
        if err != CUDA_SUCCESS {
            return Err(api.cuda_error("cudaGetDeviceCount", err));
        }
        if count <= 0 {
            return Err(format!("no CUDA device is visible (cudaGetDeviceCount: {count}, {})", api.cudart_lib));
        }
        // SAFETY: as above.
        let status = unsafe { (api.nvjpeg_create_simple)(&mut gpu.handle) };
        if status != NVJPEG_STATUS_SUCCESS {
            gpu.handle = ptr::null_mut();
            return Err(format!("nvjpegCreateSimple failed with {} ({})", status_name(status), api.nvjpeg_lib));
        }
        // SAFETY: `handle` is live.
        let status = unsafe { (api.nvjpeg_jpeg_state_create)(gpu.handle, &mut gpu.state) };
        if status != NVJPEG_STATUS_SUCCESS {
            gpu.state = ptr::null_mut();
            return Err(format!("nvjpegJpegStateCreate failed with {} ({})", status_name(status), api.nvjpeg_lib));
        }
        // SAFETY: as above.
        let err = unsafe { (api.cuda_stream_create_with_flags)(&mut gpu.stream, CUDA_STREAM_NON_BLOCKING) };
        if err != CUDA_SUCCESS {
            gpu.stream = ptr::null_mut();
            return Err(api.cuda_error("cudaStreamCreateWithFlags", err));
        }
        Ok(gpu)
    }

    /// Makes the device buffer hold at least `bytes` bytes (grows only).
    fn reserve(&mut self, bytes: usize) -> std::result::Result<(), String> {
        if bytes <= self.capacity {
            return Ok(());
        }
        if !self.buffer.is_null() {
            // Earlier work on the stream may still read the buffer.
            // SAFETY: live stream; `buffer` came from cudaMalloc.
            unsafe {
                (self.api.cuda_stream_synchronize)(self.stream);
                (self.api.cuda_free)(self.buffer);
            }
            self.buffer = ptr::null_mut();
            self.capacity = 0;
        }
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: valid out-pointer.
        let err = unsafe { (self.api.cuda_malloc)(&mut p, bytes) };
        if err != CUDA_SUCCESS || p.is_null() {
            return Err(self.api.cuda_error(&format!("cudaMalloc({bytes})"), err));
        }
        self.buffer = p;
        self.capacity = bytes;
        Ok(())
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let api = &self.api;
        // SAFETY: each object is live when non-null and is released once; errors cannot be reported from drop.
        unsafe {
            if !self.stream.is_null() {
                (api.cuda_stream_synchronize)(self.stream);
            }
            if !self.buffer.is_null() {
                (api.cuda_free)(self.buffer);
            }
            if !self.state.is_null() {
                (api.nvjpeg_jpeg_state_destroy)(self.state);
            }
            if !self.handle.is_null() {
                (api.nvjpeg_destroy)(self.handle);
            }
            if !self.stream.is_null() {
                (api.cuda_stream_destroy)(self.stream);
            }
        }
    }
}

/// What a GPU attempt produced.
enum Attempt {
    Done(DecodeInfo),
    /// nvJPEG does not decode this JPEG variant: use the CPU.
    Cpu,
}

/// The nvJPEG backend: JPEG decoding on the GPU, CPU fallback for what nvJPEG does not decode. Share one across
/// threads: each concurrent decode uses its own pooled GPU context. See the module docs for what it does not do
/// (no DCT scaling: `scale` is always 1).
pub struct NvJpegDecoder {
    api: Arc<Api>,
    /// Idle GPU contexts (at least one after [`NvJpegDecoder::new`]).
    idle: Mutex<Vec<Gpu>>,
    max_pixels: u64,
}

impl std::fmt::Debug for NvJpegDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [nvjpeg, cudart] = self.libraries();
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("NvJpegDecoder")
            .field("nvjpeg", &nvjpeg)
            .field("cudart", &cudart)
            .field("idle_contexts", &idle)
            .field("max_pixels", &self.max_pixels)
            .finish_non_exhaustive()
    }
}

impl NvJpegDecoder {
    /// Loads libnvjpeg and libcudart (once per process), checks that a CUDA device is visible, and creates the
    /// first pooled GPU context (nvJPEG handle, decode state, CUDA stream). Fails with
    /// [`DecodeError::Unavailable`], naming the library and the dlopen or CUDA error, when any of that is not
    /// possible on this machine.
    pub fn new() -> Result<Self> {
        let unavailable = |reason: String| DecodeError::Unavailable { backend: NAME, reason };
        let api = Api::get().map_err(unavailable)?;
        let gpu = Gpu::new(Arc::clone(&api)).map_err(unavailable)?;
        Ok(Self { api, idle: Mutex::new(vec![gpu]), max_pixels: DEFAULT_MAX_PIXELS })
    }

    /// Refuses images with more than `max_pixels` pixels (default [`DEFAULT_MAX_PIXELS`]).
    pub fn with_max_pixels(mut self, max_pixels: u64) -> Self {
        self.max_pixels = max_pixels;
        self
    }

    /// The names of the nvJPEG and CUDA runtime libraries that were loaded (e.g. `["libnvjpeg.so.13",
    /// "libcudart.so.13"]`).
    pub fn libraries(&self) -> [&'static str; 2] {
        [self.api.nvjpeg_lib, self.api.cudart_lib]
    }

    /// Decodes `bytes` into `out` at full size; the hint is ignored (nvJPEG has no DCT-domain scaling), so
    /// `scale` is always 1.
    pub fn decode_rgb(&self, bytes: &[u8], _hint: DecodeHint, out: &mut ImageRgb8) -> Result<DecodeInfo> {
        if bytes.is_empty() {
            return Err(DecodeError::Empty { backend: NAME });
        }
        if let Some(other) = crate::format::non_jpeg(NAME, bytes, self.max_pixels, out) {
            return other;
        }
        let taken = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut gpu = match taken {
            Some(gpu) => gpu,
            None => Gpu::new(Arc::clone(&self.api)).map_err(|reason| DecodeError::Device {
                backend: NAME,
                reason: format!("another context: {reason}"),
            })?,
        };
        let attempt = self.decode_on_gpu(&mut gpu, bytes, out);
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).push(gpu);
        match attempt? {
            Attempt::Done(info) => Ok(info),
            Attempt::Cpu => self.decode_on_cpu(bytes, out),
        }
    }

    /// The JPEG's plane layout and size from its header, or `None` for a JPEG nvJPEG does not decode.
    fn image_info(gpu: &Gpu, bytes: &[u8]) -> Result<Option<(bool, u32, u32)>> {
        let (mut components, mut subsampling) = (0 as c_int, 0 as c_int);
        let (mut widths, mut heights) = ([0 as c_int; NVJPEG_MAX_COMPONENT], [0 as c_int; NVJPEG_MAX_COMPONENT]);
        // SAFETY: live handle; `bytes` is valid for its length; the out-pointers point at 1, 1, 4 and 4 ints.
        let status = unsafe {
            (gpu.api.nvjpeg_get_image_info)(
                gpu.handle,
                bytes.as_ptr(),
                bytes.len(),
                &mut components,
                &mut subsampling,
                widths.as_mut_ptr(),
                heights.as_mut_ptr(),
            )
        };
        if status != NVJPEG_STATUS_SUCCESS {
            return if not_supported(status) {
                Ok(None)
            } else {
                Err(Self::corrupt(bytes, format!("nvjpegGetImageInfo: {}", status_name(status))))
            };
        }
        // nvJPEG decodes 1- and 3-component JPEGs; CMYK/YCCK (4) and anything else go to the CPU.
        let gray = components == 1 || subsampling == NVJPEG_CSS_GRAY;
        if !gray && components != 3 {
            return Ok(None);
        }
        let (w, h) = (widths[0], heights[0]);
        if w <= 0 || h <= 0 {
            return Err(Self::corrupt(bytes, format!("nvjpegGetImageInfo: {w}x{h} image")));
        }
        Ok(Some((gray, w as u32, h as u32)))
    }

    fn corrupt(bytes: &[u8], reason: String) -> DecodeError {
        DecodeError::Corrupt { backend: NAME, format: "JPEG", len: bytes.len(), reason }
    }

    fn decode_on_gpu(&self, gpu: &mut Gpu, bytes: &[u8], out: &mut ImageRgb8) -> Result<Attempt> {
        let api = Arc::clone(&gpu.api);
        let device = |reason: String| DecodeError::Device { backend: NAME, reason };
        let Some((gray, w, h)) = Self::image_info(gpu, bytes)? else { return Ok(Attempt::Cpu) };
        DecodeError::check_pixels(NAME, w, h, self.max_pixels)?;
        let orientation = jpeg_orientation(bytes);
        let (ow, oh) = orientation.apply_to_size(w, h);
        let channels: usize = if gray { 1 } else { 3 };
        let pitch = w as usize * channels;
        gpu.reserve(pitch * h as usize).map_err(device)?;
        let mut image =
            NvjpegImage { channel: [ptr::null_mut(); NVJPEG_MAX_COMPONENT], pitch: [0; NVJPEG_MAX_COMPONENT] };
        image.channel[0] = gpu.buffer.cast();
        image.pitch[0] = pitch;
        let format = if gray { NVJPEG_OUTPUT_Y } else { NVJPEG_OUTPUT_RGBI };
        // SAFETY: live handle, state and stream; `channel[0]` holds `pitch * h` bytes of device memory, which is
        // what one plane (Y) or one interleaved plane (RGBI) of a `w x h` image needs at `pitch`.
        let status = unsafe {
            (api.nvjpeg_decode)(gpu.handle, gpu.state, bytes.as_ptr(), bytes.len(), format, &mut image, gpu.stream)
        };
        if status != NVJPEG_STATUS_SUCCESS {
            if not_supported(status) {
                return Ok(Attempt::Cpu);
            }
            if device_failure(status) {
                return Err(device(format!("nvjpegDecode failed with {} ({})", status_name(status), api.nvjpeg_lib)));
            }
            return Err(Self::corrupt(bytes, format!("nvjpegDecode: {}", status_name(status))));
        }
        let direct = channels == 3 && orientation == Orientation::Normal;
        let (dst, dpitch) = if direct {
            out.reset(w, h);
            (out.as_bytes_mut().as_mut_ptr(), out.stride())
        } else {
            gpu.host.resize(pitch * h as usize, 0);
            (gpu.host.as_mut_ptr(), pitch)
        };
        // SAFETY: `dst` holds `h` rows of `dpitch >= pitch` bytes on the host (the last one `pitch` long at least);
        // the source is the `pitch * h` bytes just decoded on `stream`, which orders the copy after the decode.
        let err = unsafe {
            (api.cuda_memcpy_2d_async)(
                dst.cast(),
                dpitch,
                gpu.buffer,
                pitch,
                pitch,
                h as usize,
                CUDA_MEMCPY_DEVICE_TO_HOST,
                gpu.stream,
            )
        };
        if err != CUDA_SUCCESS {
            return Err(device(api.cuda_error("cudaMemcpy2DAsync", err)));
        }
        // SAFETY: live stream. The host buffer is not touched before the copy has completed.
        let err = unsafe { (api.cuda_stream_synchronize)(gpu.stream) };
        if err != CUDA_SUCCESS {
            return Err(device(api.cuda_error("cudaStreamSynchronize", err)));
        }
        if !direct {
            convert_into(&gpu.host, w, h, channels, orientation, out);
        }
        Ok(Attempt::Done(DecodeInfo { orig_width: ow, orig_height: oh, scale: 1.0 }))
    }

    /// JPEGs nvJPEG does not decode (CMYK, lossless, ...), on the CPU at full size.
    fn decode_on_cpu(&self, bytes: &[u8], out: &mut ImageRgb8) -> Result<DecodeInfo> {
        #[cfg(feature = "turbojpeg")]
        let result = crate::turbo::TurboJpegDecoder::new().with_max_pixels(self.max_pixels).decode_rgb(
            bytes,
            DecodeHint::default(),
            out,
        );
        #[cfg(all(not(feature = "turbojpeg"), feature = "image"))]
        let result = crate::image_backend::ImageDecoder::new().with_max_pixels(self.max_pixels).decode_rgb(
            bytes,
            DecodeHint::default(),
            out,
        );
        #[cfg(any(feature = "turbojpeg", feature = "image"))]
        return result.map_err(retag);
        #[cfg(not(any(feature = "turbojpeg", feature = "image")))]
        {
            let _ = out;
            Err(DecodeError::Unsupported { backend: NAME, len: bytes.len(), head: DecodeError::head(bytes) })
        }
    }
}

/// Names the CPU fallback in errors of its decoder, so they still say `nvjpeg`.
#[cfg(any(feature = "turbojpeg", feature = "image"))]
fn retag(err: DecodeError) -> DecodeError {
    let backend = FALLBACK_NAME;
    match err {
        DecodeError::Empty { .. } => DecodeError::Empty { backend },
        DecodeError::Unsupported { len, head, .. } => DecodeError::Unsupported { backend, len, head },
        DecodeError::TooLarge { width, height, limit, .. } => DecodeError::TooLarge { backend, width, height, limit },
        DecodeError::Corrupt { format, len, reason, .. } => DecodeError::Corrupt { backend, format, len, reason },
        other => other,
    }
}

impl Decoder for NvJpegDecoder {
    fn decode(&self, bytes: &[u8], hint: DecodeHint, out: &mut ImageRgb8) -> sluice_core::Result<DecodeInfo> {
        Ok(self.decode_rgb(bytes, hint, out)?)
    }

    fn name(&self) -> &str {
        NAME
    }
}

/// Whether an nvJPEG decoder can be created on this machine: `Ok`, or the [`DecodeError::Unavailable`] of the
/// first attempt. Probed once per process (a decoder is created and dropped).
pub(crate) fn probe() -> Result<()> {
    static PROBE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let result = PROBE.get_or_init(|| match NvJpegDecoder::new() {
        Ok(_) => Ok(()),
        Err(DecodeError::Unavailable { reason, .. }) => Err(reason),
        Err(other) => Err(other.to_string()),
    });
    result.clone().map_err(|reason| DecodeError::Unavailable { backend: NAME, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ffi_layouts_match_nvjpeg_h() {
        // nvjpegImage_t on LP64: four pointers then four size_t.
        assert_eq!(std::mem::size_of::<NvjpegImage>(), 64);
        assert_eq!(std::mem::align_of::<NvjpegImage>(), 8);
        assert_eq!(std::mem::offset_of!(NvjpegImage, pitch), 32);
        assert_eq!(status_name(4), "NVJPEG_STATUS_JPEG_NOT_SUPPORTED");
        assert_eq!(status_name(42), "nvjpegStatus 42");
    }
}
