from pdtop.cli import main

raise SystemExit(main())
