import sys, tempfile
sys.path.insert(0, "scripts")
import warp as wp
wp.config.quiet = True
wp.init()
from rational_registers import kernel_resources, elf_sections
from warpkan.kernels import geglu as kg
for nt in (1, 2):
    v = kg.get_tc_variant("float16", nt)
    with tempfile.TemporaryDirectory() as out:
        paths = wp.compile_aot_module(v.module, device=None, arch=90, module_dir=out, use_ptx=False)
        res = kernel_resources(str(paths[0]))
        data = open(paths[0], "rb").read()
        secs = elf_sections(data)
        for name, vals in res.items():
            short = name.split("__locals__")[-1][:30]
            sh = [size for sec, (o, size) in secs.items() if sec.startswith(".nv.shared") and name in sec]
            print(nt, short, vals, "smem", sh)
