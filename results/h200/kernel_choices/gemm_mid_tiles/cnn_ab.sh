VERS="$VERS" source .ab1b/b1.sh >/dev/null 2>&1
mkdir -p /tmp/cnn; [ -f /tmp/cnn/manifest.json ] || xz -dc .ab1b/cnn/cnn.tar.xz | tar -x -C /tmp/cnn
for r in ${ROUNDS:-1 2}; do for v in $VERS; do
  PYTHONPATH=/tmp/site_$v:/tmp/site timeout 200 python3 examples/bench_vision.py run /tmp/cnn --runs ${RUNS:-30} --json $OUT/cnn_${v}_$r.json > /tmp/v.log 2>&1
  python3 -c "
import json; r=json.load(open('$OUT/cnn_${v}_$r.json'))
print('$v', [(x['model'], x['batch'], round(x['wgpu_ms'], 2), round(x['torch_ms'], 2), x['matches']) for x in r['rows']])" || tail -5 /tmp/v.log
done; done
