/* cuda_ptx.h - the cuda backend's ready-made kernels as PTX text, so the build
 * needs no nvcc: the driver JIT-compiles the module for whatever GPU it runs on
 * (cuModuleLoadData), once per device.
 *
 * The one idea: three tiny kernels, written for the oldest target a current
 * driver still accepts (sm_52, PTX ISA 7.0), each a grid-stride loop (fill,
 * add) or a single-thread spin on %globaltimer (sleep), so any launch shape is
 * correct and the host side only picks a grid that is big enough to be fast.
 *
 *   gca_fill_u32(u64 dst, u32 value, u32 step, u64 count)   dst[i] = value + i * step
 *   gca_add_u32(u64 dst, u64 a, u64 b, u64 count)           dst[i] = a[i] + b[i]
 *   gca_sleep_ns(u64 ns)                                    busy for at least ns
 * Arithmetic on values wraps modulo 2^32; indices are 64-bit.
 */
#ifndef GCA_CUDA_PTX_H
#define GCA_CUDA_PTX_H

#define GCA_PTX_FILL_NAME  "gca_fill_u32"
#define GCA_PTX_ADD_NAME   "gca_add_u32"
#define GCA_PTX_SLEEP_NAME "gca_sleep_ns"

static const char gca__cuda_ptx[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry gca_fill_u32(\n"
    "    .param .u64 p_dst,\n"
    "    .param .u32 p_value,\n"
    "    .param .u32 p_step,\n"
    "    .param .u64 p_count)\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .b64 %rd<8>;\n"
    "    ld.param.u64 %rd1, [p_dst];\n"
    "    ld.param.u32 %r1, [p_value];\n"
    "    ld.param.u32 %r2, [p_step];\n"
    "    ld.param.u64 %rd2, [p_count];\n"
    "    cvta.to.global.u64 %rd1, %rd1;\n"
    "    mov.u32 %r3, %ctaid.x;\n"
    "    mov.u32 %r4, %ntid.x;\n"
    "    mov.u32 %r5, %tid.x;\n"
    "    mov.u32 %r6, %nctaid.x;\n"
    "    cvt.u64.u32 %rd4, %r5;\n"
    "    mad.wide.u32 %rd3, %r3, %r4, %rd4;\n" /* i = ctaid * ntid + tid */
    "    mul.wide.u32 %rd5, %r6, %r4;\n"       /* stride = nctaid * ntid */
    "$Lfill_loop:\n"
    "    setp.ge.u64 %p1, %rd3, %rd2;\n"
    "    @%p1 bra $Lfill_done;\n"
    "    cvt.u32.u64 %r7, %rd3;\n"
    "    mad.lo.u32 %r7, %r7, %r2, %r1;\n"
    "    shl.b64 %rd6, %rd3, 2;\n"
    "    add.u64 %rd7, %rd1, %rd6;\n"
    "    st.global.u32 [%rd7], %r7;\n"
    "    add.u64 %rd3, %rd3, %rd5;\n"
    "    bra.uni $Lfill_loop;\n"
    "$Lfill_done:\n"
    "    ret;\n"
    "}\n"
    "\n"
    ".visible .entry gca_add_u32(\n"
    "    .param .u64 p_dst,\n"
    "    .param .u64 p_a,\n"
    "    .param .u64 p_b,\n"
    "    .param .u64 p_count)\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .b64 %rd<12>;\n"
    "    ld.param.u64 %rd1, [p_dst];\n"
    "    ld.param.u64 %rd2, [p_a];\n"
    "    ld.param.u64 %rd3, [p_b];\n"
    "    ld.param.u64 %rd4, [p_count];\n"
    "    cvta.to.global.u64 %rd1, %rd1;\n"
    "    cvta.to.global.u64 %rd2, %rd2;\n"
    "    cvta.to.global.u64 %rd3, %rd3;\n"
    "    mov.u32 %r1, %ctaid.x;\n"
    "    mov.u32 %r2, %ntid.x;\n"
    "    mov.u32 %r3, %tid.x;\n"
    "    mov.u32 %r4, %nctaid.x;\n"
    "    cvt.u64.u32 %rd6, %r3;\n"
    "    mad.wide.u32 %rd5, %r1, %r2, %rd6;\n"
    "    mul.wide.u32 %rd7, %r4, %r2;\n"
    "$Ladd_loop:\n"
    "    setp.ge.u64 %p1, %rd5, %rd4;\n"
    "    @%p1 bra $Ladd_done;\n"
    "    shl.b64 %rd8, %rd5, 2;\n"
    "    add.u64 %rd9, %rd2, %rd8;\n"
    "    add.u64 %rd10, %rd3, %rd8;\n"
    "    add.u64 %rd11, %rd1, %rd8;\n"
    "    ld.global.u32 %r5, [%rd9];\n"
    "    ld.global.u32 %r6, [%rd10];\n"
    "    add.u32 %r7, %r5, %r6;\n"
    "    st.global.u32 [%rd11], %r7;\n"
    "    add.u64 %rd5, %rd5, %rd7;\n"
    "    bra.uni $Ladd_loop;\n"
    "$Ladd_done:\n"
    "    ret;\n"
    "}\n"
    "\n"
    ".visible .entry gca_sleep_ns(\n"
    "    .param .u64 p_ns)\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b64 %rd<6>;\n"
    "    ld.param.u64 %rd1, [p_ns];\n"
    "    mov.u64 %rd2, %globaltimer;\n"
    "$Lsleep_spin:\n"
    "    mov.u64 %rd3, %globaltimer;\n"
    "    sub.u64 %rd4, %rd3, %rd2;\n"
    "    setp.lt.u64 %p1, %rd4, %rd1;\n"
    "    @%p1 bra $Lsleep_spin;\n"
    "    ret;\n"
    "}\n";

#endif
