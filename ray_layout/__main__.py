from ray_layout.cli import main

raise SystemExit(main())
