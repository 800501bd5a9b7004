//! Which vector code this CPU can run. Every kernel does the same arithmetic in the same order
//! (no fused multiply-add, no reassociation), so each gives the same bits; the choice is speed.

/// The code that computes a block: the same arithmetic in each (no fused multiply-add, no
/// reassociation), so every kernel gives the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// AVX-512 (F, DQ, VL) with F16C and POPCNT: blocks of finite values, judged or not.
    Avx512,
    /// AVX2 with FMA and F16C: every block (the fast path of CPUs without AVX-512).
    Avx2,
    /// Plain Rust, on any CPU.
    Portable,
}

impl Kernel {
    /// The kernels this CPU can run, best first (the last is always [`Kernel::Portable`]).
    pub(crate) fn available() -> Vec<Kernel> {
        let mut kernels = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("f16c") && has!("fma") {
                if has!("avx512f") && has!("avx512dq") && has!("avx512vl") && has!("popcnt") {
                    kernels.push(Kernel::Avx512);
                }
                kernels.push(Kernel::Avx2);
            }
        }
        kernels.push(Kernel::Portable);
        kernels
    }

    /// The best kernel this CPU runs.
    pub(crate) fn best() -> Kernel {
        static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| Kernel::available()[0])
    }
}
