import sys

import msgspec

from shoal.messages import WorkerSpec
from shoal.workers.output_limit import limit_output
from shoal.workers.proc import main

_spec = msgspec.json.decode(sys.argv[1], type=WorkerSpec)
limit_output(_spec.model_name, _spec.instance_name)  # before logging holds stderr
sys.exit(main())
