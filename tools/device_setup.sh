# Sourced by the device-call scripts (gpu_check.sh, gpu_ab.sh): the two steps each call starts with
# on the bare GPU machine.
#   install_wheels WHEEL...  the carried wheels (tools/prepare_device.py) into /tmp/site: no registry there
#   build_tree DIR           the Cython modules the runtime needs, in place in DIR (built there, for its Python)
install_wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$@"
}
build_tree() {
  (cd "$1" && FLARE_BUILD_ONLY=sched,prefix_hash,jinja_vm,ngram python3 setup.py build_ext --inplace -j 8)
}
