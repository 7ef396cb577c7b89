for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --target /tmp/site ${WHEELS:-.whl}/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1
mkdir -p /tmp/site/pte_wgpu; ln -sfn $PWD/kernels /tmp/site/pte_wgpu/kernels; ln -sfn $PWD/resize /tmp/site/pte_wgpu/resize
